// The e^x approximation that vec512.h and vec256.h both compute, one set of constants: e^x = 2^k * p(r)
// with k = round(x / ln 2), r = x - k ln 2 (ln 2 in a high and a low part, so r is exact enough), and p
// the degree-6 Taylor polynomial of e^r, |r| <= ln2 / 2 (within 2 float ulps). Inputs are clamped below
// at kMin, so e^x never underflows to a denormal; NaN stays NaN. Below it, a cheaper 2^t for softmax
// probabilities that are rounded to bfloat16 (exp2_softmax_ps of vec512.h and vec256.h).
#pragma once

namespace triforce_exp {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187e-06f;
constexpr float kMin = -87.0f, kMax = 89.0f;  // e^x is inf in float32 past ln(FLT_MAX) = 88.72, below kMax
constexpr int kDegree = 6;
constexpr float kPoly[kDegree + 1] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};  // highest first

// 2^t for the probabilities of a softmax that rounds them to bfloat16 (3.9e-3) before its P . V product:
// 2^k * q(t - k), k = round(t), q a degree-4 near-minimax fit of 2^f on [-1/2, 1/2] (relative error within
// 2.7e-6 in float32), fewer operations than e^x above needs. Inputs are clamped below at kPow2Min, so 2^t
// never underflows to a denormal, but 2^-inf is 0 (a hidden key's score); NaN stays NaN.
constexpr float kPow2Min = -125.0f;
constexpr int kPow2Degree = 4;
constexpr float kPow2Poly[kPow2Degree + 1] = {0.009571808390319347f, 0.05591800436377525f, 0.24024702608585358f,
                                              0.6931217908859253f, 0.9999992847442627f};  // highest first

}  // namespace triforce_exp
