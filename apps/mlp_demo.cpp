// `make train` until the training system lands: a 2-layer MLP (784 -> 256 ->
// 10) trained on Fashion-MNIST with this library's ops and autograd, plain SGD
// with momentum, reporting the real test accuracy after each epoch.
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/threading.h"
#include "ops/ops.h"

namespace {

using forge::DType;
using forge::Tensor;

// Reads a gzip-compressed IDX file (big-endian header: magic 0x0000080D with
// D dims, then D sizes, then unsigned bytes).
std::vector<uint8_t> read_idx(const std::string& path, int expected_dims,
                              std::vector<int64_t>& dims) {
  gzFile f = gzopen(path.c_str(), "rb");
  FORGE_CHECK(f != nullptr,
              "cannot open {}: {}. Install the Debian package dataset-fashion-mnist "
              "(scripts/install-deps.sh) or pass --data DIR",
              path, std::strerror(errno));
  auto read_exact = [&](void* dst, size_t n) {
    const int got = gzread(f, dst, static_cast<unsigned>(n));
    if (got != static_cast<int>(n)) {
      gzclose(f);
      FORGE_FAIL("{}: truncated or corrupt IDX file (wanted {} bytes, got {})", path, n, got);
    }
  };
  uint8_t magic[4];
  read_exact(magic, 4);
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] != expected_dims) {
    gzclose(f);
    FORGE_FAIL(
        "{}: not an IDX file of unsigned bytes with {} dims (magic {:02x}{:02x}{:02x}{:02x})", path,
        expected_dims, magic[0], magic[1], magic[2], magic[3]);
  }
  int64_t total = 1;
  dims.clear();
  for (int d = 0; d < expected_dims; ++d) {
    uint8_t b[4];
    read_exact(b, 4);
    dims.push_back((int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) |
                   int64_t{b[3]});
    total *= dims.back();
  }
  FORGE_CHECK(total > 0 && total < (int64_t{1} << 31), "{}: implausible IDX size {}", path, total);
  std::vector<uint8_t> data(static_cast<size_t>(total));
  read_exact(data.data(), data.size());
  gzclose(f);
  return data;
}

struct Split {
  Tensor images;  // (n, 784) f32, normalised
  std::vector<int64_t> labels;
};

Split load_split(const std::string& dir, const std::string& prefix) {
  std::vector<int64_t> idims, ldims;
  const auto pixels = read_idx(dir + "/" + prefix + "-images-idx3-ubyte.gz", 3, idims);
  const auto labels = read_idx(dir + "/" + prefix + "-labels-idx1-ubyte.gz", 1, ldims);
  FORGE_CHECK(idims[0] == ldims[0], "{}: {} images but {} labels", dir, idims[0], ldims[0]);
  const int64_t n = idims[0], d = idims[1] * idims[2];
  Split s{Tensor::empty({n, d}), std::vector<int64_t>(labels.begin(), labels.end())};
  float* p = s.images.data<float>();
  // Fashion-MNIST pixel mean and standard deviation.
  for (int64_t i = 0; i < n * d; ++i)
    p[i] = (static_cast<float>(pixels[static_cast<size_t>(i)]) / 255.f - 0.2860f) / 0.3530f;
  for (int64_t y : s.labels) FORGE_CHECK(y >= 0 && y < 10, "{}: label {} outside 0..9", dir, y);
  return s;
}

// He-normal weight (out, in) and zero bias, as leaves.
Tensor he_normal(int64_t out, int64_t in, forge::Generator& g) {
  Tensor w = Tensor::randn({out, in}, DType::f32, &g);
  const float scale = std::sqrt(2.0f / static_cast<float>(in));
  float* p = w.data<float>();
  for (int64_t i = 0; i < w.numel(); ++i) p[i] *= scale;
  return w.set_requires_grad(true);
}

Tensor forward(const Tensor& x, const std::vector<Tensor>& params) {
  return forge::ops::linear(forge::ops::relu(forge::ops::linear(x, params[0], params[1])),
                            params[2], params[3]);
}

double accuracy(const Split& s, const std::vector<Tensor>& params) {
  forge::NoGradGuard no_grad;
  const Tensor logits = forward(s.images, params);
  const int64_t n = logits.size(0), c = logits.size(1);
  const float* p = logits.data<float>();
  int64_t right = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t best = 0;
    for (int64_t j = 1; j < c; ++j) best = p[i * c + j] > p[i * c + best] ? j : best;
    right += best == s.labels[static_cast<size_t>(i)];
  }
  return static_cast<double>(right) / static_cast<double>(n);
}

int run(int argc, char** argv) {
  std::string data = "/usr/share/datasets/fashion-mnist";
  int epochs = 5, threads = 0;
  int64_t batch = 128;
  double lr = 0.05, momentum = 0.9;
  uint64_t seed = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      FORGE_CHECK(i + 1 < argc, "{} needs a value", a);
      return argv[++i];
    };
    if (a == "--data")
      data = value();
    else if (a == "--epochs")
      epochs = std::stoi(value());
    else if (a == "--batch")
      batch = std::stoll(value());
    else if (a == "--lr")
      lr = std::stod(value());
    else if (a == "--seed")
      seed = std::stoull(value());
    else if (a == "--threads")
      threads = std::stoi(value());
    else
      FORGE_FAIL(
          "unknown option {} (options: --data DIR --epochs N --batch N --lr X --seed N --threads "
          "N)",
          a);
  }
  FORGE_CHECK(epochs >= 1 && batch >= 1 && lr > 0, "epochs, batch and lr must be positive");
  if (threads > 0) forge::set_num_threads(threads);

  const Split train = load_split(data, "train"), test = load_split(data, "t10k");
  const int64_t n = train.images.size(0), d = train.images.size(1);
  std::printf("Fashion-MNIST: %lld train, %lld test images; MLP %lld-256-10; %d threads\n",
              static_cast<long long>(n), static_cast<long long>(test.images.size(0)),
              static_cast<long long>(d), forge::num_threads());

  forge::Generator gen(seed);
  std::vector<Tensor> params = {
      he_normal(256, d, gen), Tensor::zeros({256}).set_requires_grad(true), he_normal(10, 256, gen),
      Tensor::zeros({10}).set_requires_grad(true)};
  std::vector<Tensor> velocity;
  for (const Tensor& p : params) velocity.push_back(Tensor::zeros(p.shape()));

  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    // Fisher-Yates shuffle driven by the Philox stream.
    const uint64_t off = gen.reserve(static_cast<uint64_t>(n));
    for (int64_t i = n - 1; i > 0; --i) {
      const auto j =
          static_cast<int64_t>(forge::Generator::word(gen.seed(), off, static_cast<uint64_t>(i)) %
                               static_cast<uint64_t>(i + 1));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
    double loss_sum = 0;
    int64_t steps = 0;
    for (int64_t start = 0; start + batch <= n; start += batch) {
      Tensor xb = Tensor::empty({batch, d});
      Tensor yb = Tensor::empty({batch}, DType::i64);
      for (int64_t r = 0; r < batch; ++r) {
        const int64_t src = order[static_cast<size_t>(start + r)];
        std::memcpy(xb.data<float>() + r * d, train.images.data<float>() + src * d,
                    sizeof(float) * static_cast<size_t>(d));
        yb.data<int64_t>()[r] = train.labels[static_cast<size_t>(src)];
      }
      Tensor loss = forge::ops::cross_entropy(forward(xb, params), yb);
      const double l = loss.item();
      FORGE_CHECK(std::isfinite(l), "epoch {} step {}: loss is {}; lower --lr", epoch, steps, l);
      for (Tensor& p : params) p.zero_grad();
      forge::autograd::backward(loss);
      // SGD with momentum: v = momentum v + g; p -= lr v.
      for (size_t k = 0; k < params.size(); ++k) {
        float* p = params[k].data<float>();
        float* v = velocity[k].data<float>();
        const float* g = params[k].grad().data<float>();
        for (int64_t i = 0; i < params[k].numel(); ++i) {
          v[i] = static_cast<float>(momentum) * v[i] + g[i];
          p[i] -= static_cast<float>(lr) * v[i];
        }
      }
      loss_sum += l;
      ++steps;
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("epoch %d  train loss %.4f  test accuracy %.2f%%  (%.1f s, %.0f images/s)\n", epoch,
                loss_sum / static_cast<double>(steps), 100.0 * accuracy(test, params), secs,
                static_cast<double>(steps * batch) / secs);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlp_demo: error: %s\n", e.what());
    return 1;
  }
}
