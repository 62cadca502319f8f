// The functional API in one include.
#pragma once

#include "ops/elementwise/elementwise.h"
#include "ops/layout/layout.h"
#include "ops/linalg/conv.h"
#include "ops/linalg/matmul.h"
#include "ops/nn/functional.h"
#include "ops/reduce/reduce.h"
