// safetensors::deserialize (core/safetensors.h) on any bytes. A file that
// reads must write back (serialize) to bytes that read as the same tensors.
#include <cstring>

#include "core/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace forge;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  safetensors::File f;
  if (!fuzz::accepts([&] { f = safetensors::deserialize(bytes, "fuzz input"); })) return 0;
  const safetensors::File g =
      safetensors::deserialize(safetensors::serialize(f.tensors, f.metadata), "reserialized");
  FUZZ_REQUIRE(g.metadata == f.metadata);
  FUZZ_REQUIRE(g.tensors.size() == f.tensors.size());
  for (const auto& [name, t] : f.tensors) {
    const auto it = g.tensors.find(name);
    FUZZ_REQUIRE(it != g.tensors.end());
    const Tensor& u = it->second;
    FUZZ_REQUIRE(u.dtype() == t.dtype() && u.shape() == t.shape() && u.nbytes() == t.nbytes());
    FUZZ_REQUIRE(t.nbytes() == 0 || std::memcmp(u.raw_data(), t.raw_data(), t.nbytes()) == 0);
  }
  return 0;
}
