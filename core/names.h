// Enum <-> name: each enum's names live in one table next to the enum, and
// the lookups are written once, here.
//
//   enum class NormKind { layer, scale, rezero };
//   inline constexpr NameTable<NormKind, 3> kNormNames{"norm", {"layer", "scale", "rezero"}};
//   name_of(kNormNames, NormKind::scale)   -> "scale"
//   enum_from_name(kNormNames, "rezero")   -> NormKind::rezero
//   enum_from_name(kNormNames, "batch")    -> throws "unknown norm 'batch'; expected one of:
//                                             layer, scale, rezero"
//   names_of(kNormNames)                   -> {"layer", "scale", "rezero"} (the recipe
//                                             schema's choices are built from it)
// The table lists the names in the enum's order: value i is names[i].
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace forge {

template <typename E, size_t K>
struct NameTable {
  const char* what;                  // what the names name, for errors ("norm")
  std::array<const char*, K> names;  // names[i] is the name of static_cast<E>(i)
};

template <typename E, size_t K>
constexpr const char* name_of(const NameTable<E, K>& t, E e) {
  const auto i = static_cast<size_t>(e);
  return i < K ? t.names[i] : "?";
}

template <typename E, size_t K>
E enum_from_name(const NameTable<E, K>& t, std::string_view name) {
  for (size_t i = 0; i < K; ++i)
    if (name == t.names[i]) return static_cast<E>(i);
  std::string valid;
  for (size_t i = 0; i < K; ++i) valid += (i ? ", " : "") + std::string(t.names[i]);
  FORGE_FAIL("unknown {} '{}'; expected one of: {}", t.what, name, valid);
}

template <typename E, size_t K>
std::vector<std::string> names_of(const NameTable<E, K>& t) {
  return {t.names.begin(), t.names.end()};
}

}  // namespace forge
