// Recipe comparison for the recipe harnesses.
#pragma once

#include "train/recipe.h"

namespace forge::fuzz {

// Whether every key of the schema has the same value in `a` and `b`, and,
// when `same_explicit`, the same is_set.
inline bool same_values(const train::Recipe& a, const train::Recipe& b, bool same_explicit) {
  for (const train::KeySpec& k : train::recipe_schema()) {
    if (!(a.value(k.path) == b.value(k.path))) return false;
    if (same_explicit && a.is_set(k.path) != b.is_set(k.path)) return false;
  }
  return true;
}

}  // namespace forge::fuzz
