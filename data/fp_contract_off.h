// Included first by the files whose float arithmetic must round as PIL's and
// timm's (baseline x86-64, no FMA): no contraction of a * b + c into one fused
// multiply-add in the rest of the file, nor in the inline code of the headers
// it includes after this one (Rng::uniform(lo, hi)). A pragma only: it must
// come before any other include.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
