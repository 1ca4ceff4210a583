// The part of decode attention that every instruction-set level shares (attention_bf16.cpp for
// AVX512-BF16 and AMX, attention_avx2.cpp for AVX2, attention_f32.cpp for float32): argument checks, the split of each KV head's keys
// into ranges processed in parallel (flash-decoding), a token tree's rows over their keys in a step's
// order, and the merge of the ranges' partial results. A level supplies only the range function: the
// online-softmax pass over keys [begin, end) of one head.
#pragma once
#include "aten.h"
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace triforce_attention {

constexpr int kMaxRows = 128;  // G * n: query rows that share one pass over a KV head
constexpr int64_t kSpan = 512;  // keys per range processed in parallel (a multiple of kAlign)
constexpr int64_t kAlign = 64;  // a multiple of every level's keys per block (32 AVX2 and AMX, 64 AVX-512)

struct Partial {  // one row's online-softmax state over a range of keys
  float max, sum;
};

// Which of a KV head's S keys row r (query r % n of the n new ones) sees: every key before the last m;
// among the last m (the new tokens last), those its mask row allows, or without a mask (a chain, m == n)
// the new tokens up to its own. Only blocks that reach key `first()` need a look.
struct TailMask {
  const bool* bits;  // [n, m] row-major, or nullptr: causal
  int n, m;
  int64_t S;  // the keys of the pass's K and V, all of which exist
  int64_t first() const { return S - m; }
  bool sees(int r, int64_t key) const {
    const int64_t t = key - (S - m);
    if (t < 0) return true;
    const int i = r % n;
    return bits ? bits[static_cast<int64_t>(i) * m + t] : t <= i;
  }
};

// scores[r][j] = -inf for the keys b0 + j (j < nb) that row r does not see, and for the padding j in
// [nb, width). Row-major score blocks of the vector kernels.
template <int W>
inline void hide_keys(float (*scores)[W], int R, int64_t b0, int nb, int width, const TailMask& mask) {
  if (b0 + nb - 1 < mask.first() && nb == width) return;
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < width; ++j)
      if (j >= nb || !mask.sees(r, b0 + j)) scores[r][j] = -std::numeric_limits<float>::infinity();
}

// Asks for the K and V rows of the next block of one head's keys (rows k_row elements apart) while the
// range function computes on the block before: `next` names the block and how many calls of `step` its
// lines are spread over, `step` asks for the next share of them, `finish` for any left. The range
// functions of the vector paths call `step` between their pieces of work (AVX512-BF16: a few rows'
// scores of 16 keys, a row's softmax, a few rows' P . V; AVX2: every row's scores of 4 keys, a row's
// softmax, a few rows' P . V), a few lines at a time. Asked for all at once at the start of each block,
// as the AVX512-BF16 path did until 2026-12-05 (the AVX2 path asked for none), a 64-key block's 256 lines
// (bfloat16, head dim 64) filled the core's miss buffers and load queue, the block's own computation
// waited behind them, and memory and compute took turns: on the 2-core Zen 4
// (AVX512-BF16, no AMX) spread out they cut SmolLM2's 30 layers of attention over 16,000 cold keys from
// 24.7 to 16.1 ms for one new token and from 46.0 to 33.0 ms for seven (0.65x and 0.72x; at 2,000 keys
// 0.78x and 0.76x: `python benchmarks/kernel_ab.py --base 92cbc05 --tokens 16000 2000 --new 1 7`, one run;
// the AVX2 range pass 0.77x and 0.85x, docs/speed.md), where the burst had gained nothing over the
// hardware prefetcher alone. `keys` bounds what is asked for: the rows of K and V that exist, not the
// range, so the last block of a range asks for the first of the next, which the same thread takes next
// (parallel_for hands each thread consecutive ranges of a head; on the AMX Xeon 0.96-1.02x the time of
// stopping at the range's end, which the tile path did until 2026-12-06, `benchmarks/results/amx_prefetch/keys_not_range.jsonl`).
// The AMX tile path spreads the next block over nine steps per group of 16
// rows (its two score tiles, the softmax's max and exponentials, P's transpose, P . V's epilogue by four
// rows): on a 2-core AMX Xeon (2026-12-06) four steps ran 0.80-0.99x the time of asking for the whole
// block in one burst, as it did before (`python benchmarks/kernel_ab.py --base 44c86e9 --tokens 2000 8000
// 32000 --new 1 8 16 42`, one run; the burst had spent 30% of a pass waiting on its own prefetches), and
// nine 0.90-0.99x four's (`--base 9fe8351`); asking two blocks ahead gained less (0.83-1.03x the burst).
template <int D, typename T>
class NextBlock {
 public:
  NextBlock(const T* k, const T* v, int64_t k_row, int64_t keys)
      : k_(reinterpret_cast<const char*>(k)), v_(reinterpret_cast<const char*>(v)),
        row_bytes_(k_row * static_cast<int64_t>(sizeof(T))), keys_(keys) {}

  // Keys [from, from + count), within the keys that exist, over `steps` calls of step().
  void next(int64_t from, int64_t count, int steps) {
    from_ = from;
    lines_ = static_cast<int>(std::max<int64_t>(0, std::min(count, keys_ - from))) * 2 * static_cast<int>(kRowLines);
    done_ = 0;
    per_step_ = (lines_ + steps - 1) / std::max(1, steps);
  }
  void step() { ask(std::min(lines_, done_ + per_step_)); }
  void finish() { ask(lines_); }

 private:
  static constexpr unsigned kRowLines = D * sizeof(T) / 64;  // 64-byte lines of a key's row
  // Line l: key l / (2 kRowLines), its K row's lines first, then its V row's. Unsigned, so that the
  // divisions by these powers of two are shifts (signed ones cost a fix-up each). A whole key's lines
  // go in one straight run from its two rows, in the same order (the address of each line apart had
  // cost more instructions than its prefetch).
  void ask(int upto) {
    while (done_ < upto) {
      const unsigned l = static_cast<unsigned>(done_), key = l / (2 * kRowLines), line = l % (2 * kRowLines);
      const int64_t at = (from_ + key) * row_bytes_;
      if (line == 0 && done_ + static_cast<int>(2 * kRowLines) <= upto) {
        for (unsigned i = 0; i < kRowLines; ++i) _mm_prefetch(k_ + at + i * 64, _MM_HINT_T0);
        for (unsigned i = 0; i < kRowLines; ++i) _mm_prefetch(v_ + at + i * 64, _MM_HINT_T0);
        done_ += 2 * kRowLines;
        continue;
      }
      _mm_prefetch((line < kRowLines ? k_ : v_) + at + (line % kRowLines) * 64, _MM_HINT_T0);
      ++done_;
    }
  }
  const char *k_, *v_;
  int64_t row_bytes_, keys_, from_ = 0;
  int lines_ = 0, done_ = 0, per_step_ = 0;
};

// Online-softmax state of each of the R = G * n rows over keys [begin, end) of one KV head, and the
// unnormalised output acc [R, D]: the pass continues the state st and acc hold (max -inf, sum 0 and zeros
// for a fresh range; a tree's rows continue theirs over a copy of their keys, flash_decode), block by
// block from `begin`, so that a range in two calls split at a block boundary sums as it does in one. Keys
// a row does not see (`mask`) are skipped.
template <typename T>  // the element type of q, K, V and the output: at::BFloat16, or float (attention_f32.cpp)
using RangeFn = void (*)(const T* q, const T* k, const T* v, int64_t k_row,
                         int R, const TailMask& mask, int64_t begin, int64_t end, float scale, float* acc,
                         Partial* st);

// Whether a row of scores holds a NaN (a key of NaN): a vector max that came out -inf ("every key
// masked") may have dropped one, as max instructions return their second operand when either is NaN.
inline bool any_nan(const float* row, int n) {
  for (int j = 0; j < n; ++j)
    if (std::isnan(row[j])) return true;
  return false;
}

// A range's fresh state for R rows of D dims: max -inf, sum 0, zero sums.
inline void start_range(float* sums, Partial* st, int R, int D) {
  std::fill_n(sums, static_cast<int64_t>(R) * D, 0.0f);
  std::fill_n(st, R, Partial{-std::numeric_limits<float>::infinity(), 0.0f});
}

// Each of the n queries' visible keys among the last m, in order, where some query's are not a prefix of
// them (a tree: a node sees its ancestors, with other branches' nodes between them); empty where every
// query's are (a chain), whose keys then sit where a one-token step after them would hold them.
inline std::vector<std::vector<int64_t>> scattered_tails(const TailMask& mask) {
  std::vector<std::vector<int64_t>> tails(static_cast<size_t>(mask.n));
  bool scattered = false;
  for (int i = 0; i < mask.n; ++i) {
    for (int64_t key = mask.first(); key < mask.S; ++key)
      if (mask.sees(i, key)) {
        scattered |= key != mask.first() + static_cast<int64_t>(tails[i].size());
        tails[i].push_back(key);
      }
  }
  if (!scattered) tails.clear();
  return tails;
}

// Copies keys [from, first) then `tail` of one head (rows of D elements, k_row apart) into `to`, rows
// adjacent: the keys a one-token step after the tail's tokens holds from `from` on.
template <int D, typename T>
inline void gather_keys(const T* src, int64_t k_row, int64_t from, int64_t first, const std::vector<int64_t>& tail,
                        T* to) {
  int64_t j = 0;
  for (int64_t key = from; key < first; ++key, ++j) std::copy_n(src + key * k_row, D, to + j * D);
  for (int64_t key : tail) std::copy_n(src + key * k_row, D, to + j++ * D);
}

// One sequence's attention in a batch: its arguments, its key ranges and their partial results.
template <typename T>
struct Job {
  at::Tensor q, k, v, bits, out;  // q [Hq, n, D] contiguous, with the G query heads of a KV head adjacent
  TailMask mask;
  int64_t hkv = 0, n = 0, splits = 0, together = 0;  // keys [0, together) run in the ranges' pass
  int G = 0, R = 0;
  std::vector<std::vector<int64_t>> tails;  // a tree's rows' keys (scattered_tails), else empty
  std::unique_ptr<float[]> acc;             // each range's [R, D] sums
  std::vector<Partial> st;                  // and each row's state there
};

// Where item i of a batch's pass falls: the job whose [first[j], first[j + 1]) holds it, and i's place there.
inline std::pair<size_t, int64_t> locate(const std::vector<int64_t>& first, int64_t i) {
  const size_t j = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), i) - first.begin()) - 1;
  return {j, i - first[j]};
}

// first[j] = the items of the jobs before j (count(job) each), and first.back() all of them.
template <typename T, typename Count>
std::vector<int64_t> item_starts(const std::vector<Job<T>>& jobs, Count count) {
  std::vector<int64_t> first(jobs.size() + 1, 0);
  for (size_t j = 0; j < jobs.size(); ++j) first[j + 1] = first[j] + count(jobs[j]);
  return first;
}

// Row r of head h of a job: its ranges' sums rescaled to their common max, normalised, into `out`.
template <int D, typename T>
void merge_row(const Job<T>& job, int64_t h, int64_t r) {
  const int64_t splits = job.splits, R = job.R;
  const Partial* st = job.st.data();
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t sp = 0; sp < splits; ++sp) m = std::max(m, st[(h * splits + sp) * R + r].max);
  float total = 0.0f;
  float row[256] = {0.0f};
  for (int64_t sp = 0; sp < splits; ++sp) {
    const Partial& p = st[(h * splits + sp) * R + r];
    if (p.sum == 0.0f) continue;
    const float w = std::exp(p.max - m);
    total += p.sum * w;
    const float* a = job.acc.get() + ((h * splits + sp) * R + r) * D;
    for (int c = 0; c < D; ++c) row[c] += w * a[c];
  }
  T* o = job.out.template data_ptr<T>() + (h * R + r) * D;  // rows of head h: query heads h*G.. with n queries each
  // a row that sees no key (every split empty) is zeros, as an empty softmax times V is; not 0 / 0. A NaN
  // score (a key of NaN: its token's activations overflowed) makes the row NaN, as in torch's attention,
  // so the request fails rather than answer as if that key were masked
  const bool any = total > 0.0f || std::isnan(total);
  for (int c = 0; c < D; ++c) o[c] = T(any ? row[c] / total : 0.0f);
}

// Query i of head h of a job with a tree's rows: its G rows from `together` on, over a copy of its keys in
// the order a one-token step after its path holds them (kc, vc, qc, sums, state: the caller's scratch).
template <int D, typename T>
void resume_tail(Job<T>& job, int64_t h, int64_t i, float scale, RangeFn<T> range, std::vector<T>& kc,
                 std::vector<T>& vc, std::vector<T>& qc, std::vector<float>& sums, std::vector<Partial>& state) {
  const int G = job.G, R = job.R;
  const int64_t n = job.n, span = kSpan, together = job.together, first = job.mask.first();
  const auto& tail = job.tails[i];
  const int64_t keys = first + static_cast<int64_t>(tail.size());  // a step's S
  const TailMask sees_all_copied{nullptr, 1, 0, keys - together};  // every key of the copy, which holds no more
  const auto* qp = job.q.template data_ptr<T>();
  kc.resize(static_cast<size_t>((keys - together) * D));
  vc.resize(kc.size());
  qc.resize(static_cast<size_t>(G * D));
  sums.resize(static_cast<size_t>(G * D));
  state.resize(static_cast<size_t>(G));
  gather_keys<D>(job.k.template data_ptr<T>() + h * job.k.stride(0), job.k.stride(1), together, first, tail, kc.data());
  gather_keys<D>(job.v.template data_ptr<T>() + h * job.v.stride(0), job.v.stride(1), together, first, tail, vc.data());
  for (int g = 0; g < G; ++g) std::copy_n(qp + (h * R + g * n + i) * D, D, qc.data() + g * D);
  float* acc = job.acc.get();
  for (int64_t a = together; a < keys;) {  // the rest of together's range, then whole ranges
    const int64_t sp = a / span, end = std::min(keys, (sp + 1) * span), item = h * job.splits + sp;
    for (int g = 0; g < G; ++g) {  // the state so far of rows (g, i)
      std::copy_n(acc + (item * R + g * n + i) * D, D, sums.data() + g * D);
      state[g] = job.st[item * R + g * n + i];
    }
    range(qc.data(), kc.data(), vc.data(), D, G, sees_all_copied, a - together, end - together, scale, sums.data(),
          state.data());
    for (int g = 0; g < G; ++g) {
      std::copy_n(sums.data() + g * D, D, acc + (item * R + g * n + i) * D);
      job.st[item * R + g * n + i] = state[g];
    }
    a = end;
  }
}

// The attention of every job (sequences of one model: one head dim), each job's out filled. Each pass
// (the ranges, a tree's rows, the merge) is one parallel loop over the items of all jobs, so a batch of
// sequences pays the threads' start and end once per layer, not once per sequence, and the threads share
// all of its work (a sequence's few ranges, split in two, left a thread idle while the other ran a longer
// one: a fifth of a batch of 8 short checks' time went to that wait on 2 cores).
template <int D, typename T>
void flash_decode(std::vector<Job<T>>& jobs, float scale, RangeFn<T> range) {
  const int64_t span = kSpan;
  for (auto& job : jobs) {
    const int64_t S = job.k.size(1);
    // Key ranges of kSpan keys at fixed offsets (0, kSpan, 2 kSpan, ...), not sized by S: a row's sums then
    // run in one order however many keys follow the ones it sees, so a check of n tokens gives each token
    // the attention a one-token step gives it, bit for bit (keys a row does not see add exact zeros).
    job.splits = (S + span - 1) / span;
    // A tree's rows (scattered tails) see their keys from the last kAlign boundary before the tail on in
    // another order than the cache holds them: all rows run together up to that boundary, and each query's
    // rows then apart over a copy of its keys in a step's order (the ranges' blocks stay where a step has
    // them; a row's sums run in one order whatever rows share its pass).
    job.tails = scattered_tails(job.mask);
    job.together = job.tails.empty() ? S : job.mask.first() / kAlign * kAlign;
    // Each range's [R, D] sums, zeroed by the thread that fills them (a buffer of ceil(S / 512) ranges per
    // head: 50 MB at 64K keys, 8 KV heads and 96 rows, which one thread zeroing up front took 30 ms of;
    // a batch holds every sequence's at once).
    job.acc.reset(new float[static_cast<size_t>(job.hkv * job.splits * job.R * D)]);
    job.st.resize(static_cast<size_t>(job.hkv * job.splits * job.R));
  }
  const auto ranges = item_starts(jobs, [](const Job<T>& job) { return job.hkv * job.splits; });
  at::parallel_for(0, ranges.back(), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const auto [j, item] = locate(ranges, i);
      Job<T>& job = jobs[j];
      const int64_t h = item / job.splits, sp = item % job.splits, R = job.R;
      const int64_t begin = sp * span, end = std::min(job.together, begin + span);
      float* sums = job.acc.get() + item * R * D;
      start_range(sums, job.st.data() + item * R, static_cast<int>(R), D);
      if (begin < end)
        range(job.q.template data_ptr<T>() + h * R * D, job.k.template data_ptr<T>() + h * job.k.stride(0),
              job.v.template data_ptr<T>() + h * job.v.stride(0), job.k.stride(1), job.R, job.mask, begin, end,
              scale, sums, job.st.data() + item * R);
    }
  });
  const auto tails = item_starts(jobs, [](const Job<T>& job) { return job.tails.empty() ? 0 : job.hkv * job.n; });
  if (tails.back() > 0) {  // query i's G rows (one per query head of head h) share its keys' order
    at::parallel_for(0, tails.back(), 1, [&](int64_t b, int64_t e) {
      std::vector<T> kc, vc, qc;
      std::vector<float> sums;
      std::vector<Partial> state;
      for (int64_t i = b; i < e; ++i) {
        const auto [j, item] = locate(tails, i);
        resume_tail<D, T>(jobs[j], item / jobs[j].n, item % jobs[j].n, scale, range, kc, vc, qc, sums, state);
      }
    });
  }
  const auto rows = item_starts(jobs, [](const Job<T>& job) { return job.hkv * job.R; });
  at::parallel_for(0, rows.back(), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const auto [j, hr] = locate(rows, i);
      merge_row<D, T>(jobs[j], hr / jobs[j].R, hr % jobs[j].R);
    }
  });
}

// One sequence's Job from the arguments of decode_attention_bf16 / _f32, checked.
// mask: [n, m] bool over the last m keys (n <= m <= S), or none for a chain.
template <typename T>
inline Job<T> make_job(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::optional<at::Tensor>& mask) {
  constexpr auto type = c10::CppTypeToScalarType<T>::value;
  TORCH_CHECK(q.scalar_type() == type && k.scalar_type() == type && v.scalar_type() == type,
              type == at::kFloat ? "float32 only" : "bfloat16 only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q [Hq, n, D], k and v [Hkv, S, D]");
  const int64_t hq = q.size(0), n = q.size(1), d = q.size(2), hkv = k.size(0), S = k.size(1);
  TORCH_CHECK(d == 64 || d == 128, "head dim 64 or 128");
  TORCH_CHECK(k.size(2) == d && v.size(2) == d && v.size(0) == hkv && v.size(1) == S, "k, v shapes");
  TORCH_CHECK(hkv >= 1 && hq % hkv == 0 && n >= 1 && n <= S && (hq / hkv) * n <= kMaxRows, "heads / rows");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1 && k.stride(1) == d && v.stride(1) == d &&
              k.stride(0) == v.stride(0), "k and v rows must be contiguous, with equal head strides");
  Job<T> job;
  job.mask = TailMask{nullptr, static_cast<int>(n), static_cast<int>(n), S};
  if (mask.has_value() && mask->defined()) {
    job.bits = mask->contiguous();
    const auto& bits = job.bits;
    TORCH_CHECK(bits.scalar_type() == at::kBool && bits.dim() == 2 && bits.size(0) == n && bits.size(1) >= n &&
                bits.size(1) <= S && bits.device().is_cpu(), "mask: bool [n, m] with n <= m <= S, on the CPU");
    job.mask = TailMask{bits.template data_ptr<bool>(), static_cast<int>(n), static_cast<int>(bits.size(1)), S};
  }
  // [Hq, n, D] with the G query heads of each KV head adjacent: row (g, i) of head h is q[h*G + g, i].
  job.q = q.contiguous();
  job.k = k, job.v = v, job.out = at::empty_like(job.q);
  job.hkv = hkv, job.n = n, job.G = static_cast<int>(hq / hkv), job.R = static_cast<int>(hq / hkv * n);
  return job;
}

// decode_attention_bf16 / _f32 of several sequences at once (one model's: one head dim), a result each,
// with the range function for the head dim; the arguments checked (make_job).
template <typename T>
inline std::vector<at::Tensor> decode_attention_batch(const std::vector<at::Tensor>& qs,
                                                      const std::vector<at::Tensor>& ks,
                                                      const std::vector<at::Tensor>& vs, double scale,
                                                      const std::vector<std::optional<at::Tensor>>& masks,
                                                      RangeFn<T> range64, RangeFn<T> range128) {
  TORCH_CHECK(!qs.empty() && ks.size() == qs.size() && vs.size() == qs.size() && masks.size() == qs.size(),
              "one k, v and mask per q");
  std::vector<Job<T>> jobs;
  jobs.reserve(qs.size());
  for (size_t j = 0; j < qs.size(); ++j) {
    jobs.push_back(make_job<T>(qs[j], ks[j], vs[j], masks[j]));
    TORCH_CHECK(qs[j].size(2) == qs[0].size(2), "one head dim for the batch");
  }
  if (qs[0].size(2) == 64) flash_decode<64, T>(jobs, static_cast<float>(scale), range64);
  else flash_decode<128, T>(jobs, static_cast<float>(scale), range128);
  std::vector<at::Tensor> out;
  for (auto& job : jobs) out.push_back(job.out);
  return out;
}

}  // namespace triforce_attention
