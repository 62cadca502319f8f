// model.init_from's timm name mapping (train/timm_names.h) on any bytes: each
// line "name<TAB>d0,d1,..." is a tensor of a timm state dict; the first 8
// bytes are two token counts for the position embedding's grids. Every part a
// name maps to has a name and rows inside the tensor's first dimension (a
// split of attn.qkv in three equal parts covering it); grids that are
// accepted describe both counts exactly.
#include <cstring>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "train/timm_names.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace forge;
  using namespace forge::train;
  if (size >= 8) {
    int32_t counts[2];
    std::memcpy(counts, data, sizeof counts);
    PositionGrids g;
    if (fuzz::accepts([&] { g = position_grids(counts[0], counts[1]); })) {
      FUZZ_REQUIRE(g.extra >= 0 && g.source >= 0 && g.target >= 0);
      FUZZ_REQUIRE(g.extra + g.target * g.target == counts[1]);
      FUZZ_REQUIRE(g.extra + g.source * g.source == counts[0]);
    }
  }
  const std::string text(reinterpret_cast<const char*>(data), size);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    const size_t tab = line.find('\t');
    const std::string name = line.substr(0, tab);
    std::vector<int64_t> shape;
    if (tab != std::string::npos)
      for (size_t b = tab + 1; b < line.size();) {
        size_t c = line.find(',', b);
        if (c == std::string::npos) c = line.size();
        int64_t v = 0;
        for (size_t k = b; k < c && k < b + 6; ++k) v = v * 10 + (line[k] & 15);
        shape.push_back(v);
        b = c + 1;
      }
    std::vector<TimmPart> parts;
    if (!fuzz::accepts([&] { parts = from_timm_name(name, shape); })) continue;
    FUZZ_REQUIRE(!parts.empty());
    int64_t covered = 0;
    for (const TimmPart& p : parts) {
      FUZZ_REQUIRE(!p.name.empty() || name.empty());
      if (p.rows < 0) continue;
      FUZZ_REQUIRE(!shape.empty() && p.first_row == covered && p.first_row + p.rows <= shape[0]);
      covered += p.rows;
    }
    FUZZ_REQUIRE(parts.size() == 1 || (parts.size() == 3 && covered == shape[0]));
  }
  return 0;
}
