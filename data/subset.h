// Subset: the first `count` examples of another dataset (recipes' limit_train /
// limit_eval, for quick runs and tests).
#pragma once

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "data/dataset.h"

namespace forge::data {

class Subset : public Dataset {
 public:
  Subset(DatasetPtr base, int64_t count)
      : base_(std::move(base)), count_(std::min(count, base_->size())) {
    FORGE_CHECK(count > 0, "Subset: count must be positive, got {}", count);
  }
  int64_t size() const override { return count_; }
  Example get(int64_t i, Rng* rng) const override { return base_->get(i, rng); }
  int64_t num_classes() const override { return base_->num_classes(); }
  std::vector<std::string> class_names() const override { return base_->class_names(); }
  std::string describe() const override {
    return fmt::format("the first {} of {}", count_, base_->describe());
  }

 private:
  DatasetPtr base_;
  int64_t count_;
};

}  // namespace forge::data
