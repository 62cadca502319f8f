// Progress formatting: bar cells, durations, counts and the ETA average.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/test_util.h"
#include "train/progress.h"

namespace forge::train {
namespace {

// Display cells of a UTF-8 string: code points (every byte that does not
// continue a sequence).
int cells(const std::string& s) {
  int n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

TEST(Progress, Bar) {
  EXPECT_EQ(progress_bar(0, 4), "    ");
  EXPECT_EQ(progress_bar(1, 4), "\u2588\u2588\u2588\u2588");
  EXPECT_EQ(progress_bar(0.5, 4), "\u2588\u2588  ");
  EXPECT_EQ(progress_bar(0.55, 10), "\u2588\u2588\u2588\u2588\u2588\u258c    ");  // 5.5 cells
  EXPECT_EQ(progress_bar(1.0 / 32, 4), "\u258f   ");  // an eighth of a cell
  EXPECT_EQ(progress_bar(1.0 / 16, 4), "\u258e   ");  // a quarter
  EXPECT_EQ(progress_bar(0.999, 2), "\u2588\u2589");  // 7/8 of the last cell
  EXPECT_EQ(progress_bar(2.0, 3), "\u2588\u2588\u2588");
  EXPECT_EQ(progress_bar(-1, 3), "   ");
  EXPECT_EQ(progress_bar(NAN, 3), "   ");
  EXPECT_EQ(progress_bar(0.5, 0), "");
  EXPECT_EQ(progress_bar(0.55, 10, false), "#####.....");
  EXPECT_EQ(progress_bar(1, 3, false), "###");
  for (int w : {1, 7, 30}) {
    for (double f = 0; f <= 1.0; f += 0.013) {
      EXPECT_EQ(cells(progress_bar(f, w)), w) << f;
      EXPECT_EQ(progress_bar(f, w, false).size(), static_cast<size_t>(w)) << f;
    }
  }
}

TEST(Progress, Duration) {
  EXPECT_EQ(format_duration(0), "0.0s");
  EXPECT_EQ(format_duration(12.34), "12.3s");
  EXPECT_EQ(format_duration(59.94), "59.9s");
  EXPECT_EQ(format_duration(59.96), "1m00s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3599.4), "59m59s");
  EXPECT_EQ(format_duration(3599.6), "1h00m");
  EXPECT_EQ(format_duration(3725), "1h02m");
  EXPECT_EQ(format_duration(86399), "1d00h");
  EXPECT_EQ(format_duration(2 * 86400 + 3 * 3600 + 100), "2d03h");
  EXPECT_EQ(format_duration(-1), "--");
  EXPECT_EQ(format_duration(NAN), "--");
  EXPECT_EQ(format_duration(INFINITY), "--");
  EXPECT_EQ(format_duration(1e12).back(), 'd');
}

TEST(Progress, Count) {
  EXPECT_EQ(format_count(0), "0");
  EXPECT_EQ(format_count(7), "7");
  EXPECT_EQ(format_count(999), "999");
  EXPECT_EQ(format_count(12.34), "12.3");
  EXPECT_EQ(format_count(123.4), "123");
  EXPECT_EQ(format_count(0.01234), "0.0123");
  EXPECT_EQ(format_count(999.7), "1.0k");
  EXPECT_EQ(format_count(1234), "1.2k");
  EXPECT_EQ(format_count(12345), "12.3k");
  EXPECT_EQ(format_count(99960), "100k");
  EXPECT_EQ(format_count(123456), "123k");
  EXPECT_EQ(format_count(999999), "1.0M");
  EXPECT_EQ(format_count(3.4e6), "3.4M");
  EXPECT_EQ(format_count(2.5e9), "2.5G");
  EXPECT_EQ(format_count(7e12), "7.0T");
  EXPECT_EQ(format_count(-1500), "-1.5k");
  EXPECT_EQ(format_count(NAN), "nan");
  EXPECT_EQ(format_count(-INFINITY), "-inf");
}

TEST(Progress, EtaFollowsTheAverageStepTime) {
  EtaEstimator eta(0.5);
  EXPECT_FALSE(eta.ready());
  EXPECT_TRUE(std::isnan(eta.eta(10)));
  EXPECT_EQ(format_duration(eta.eta(10)), "--");
  eta.add(2.0);
  EXPECT_DOUBLE_EQ(eta.seconds_per_step(), 2.0);  // the first step sets it
  EXPECT_DOUBLE_EQ(eta.eta(10), 20.0);
  eta.add(1.0);
  EXPECT_DOUBLE_EQ(eta.seconds_per_step(), 1.5);
  eta.add(1.0);
  EXPECT_DOUBLE_EQ(eta.seconds_per_step(), 1.25);
  EXPECT_DOUBLE_EQ(eta.eta(0), 0.0);
  EXPECT_DOUBLE_EQ(eta.eta(-5), 0.0);

  // Ten steps reported at once weigh like ten reported one by one.
  EtaEstimator one(0.1), batch(0.1);
  one.add(3.0);
  batch.add(3.0);
  for (int i = 0; i < 10; ++i) one.add(0.5);
  batch.add(5.0, 10);
  EXPECT_NEAR(one.seconds_per_step(), batch.seconds_per_step(), 1e-12);
  EXPECT_GT(one.seconds_per_step(), 0.5);
  EXPECT_LT(one.seconds_per_step(), 3.0);

  forge::testing::expect_error([] { EtaEstimator bad(0.0); }, {"smoothing"});
  forge::testing::expect_error([&] { one.add(1.0, 0); }, {"steps"});
  forge::testing::expect_error([&] { one.add(-1.0); }, {"seconds"});
}

}  // namespace
}  // namespace forge::train
