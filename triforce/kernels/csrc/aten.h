// The part of ATen that the kernel sources share. torch/extension.h (torch's whole C++ API and pybind11)
// costs about 20 s of compiling per source file, these headers about 4 s; only bindings.cpp needs it. A
// fresh install compiles 18 sources across the three levels, most of a first run's wait.
#pragma once
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <optional>
