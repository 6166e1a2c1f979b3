// Single-pass host AdamW for one contiguous range of a unit (executor/host_adam.py builds and
// calls it). Per element: read the gradient (FP32/BF16/FP16), the FP32 master and the moments
// (FP32 or BF16), write master, moments and the compute-dtype copy the next upload reads (none
// where `out` is absent: a unit whose upload is cast from the master later). Each byte is touched
// once, so the op runs at the host's memory bandwidth (28 B/element with FP32 moments and a BF16
// gradient and copy, 20 B with BF16 moments, 2 B less without the copy). A speculative update
// also writes the state as it was into `saved_*` on the way (global clipping's rollback).
//
// The arithmetic is torch's fused CPU AdamW (aten/src/ATen/native/cpu/FusedAdamKernel.cpp,
// ADAMW mode, vector body as GCC builds it) written out per element: coefficients in double,
// cast to float once; m = fma(1 - beta1, g - m, m) (at::vec lerp); v = fma((1 - beta2) * g, g,
// v * beta2) (GCC contracts torch's mul + add into this fma); p = p * (1 - lr * wd) +
// (-step_size * m) / (sqrt(v) / sqrt(bc2) + eps). So it equals the previous path (upcast,
// torch._fused_adamw_, cast) bit for bit except at the few elements torch runs through its
// scalar tail, where v may differ in the last bit. -ffp-contract=off keeps the compiler from
// fusing anything else. Conversions to BF16 round to nearest even (NaN stays NaN), as
// Tensor.copy_ does.
//
// The loop is plain scalar C++ that GCC vectorises at -O3 for the ISA flags the loader passes
// (AVX-512 or AVX2). Threads: one OpenMP region of at::get_num_threads() threads (what
// torch.set_num_threads set for the calling thread), each on one contiguous block. The count is
// passed explicitly rather than left to at::parallel_for because this library may bind a
// different libgomp than torch's (PyPI wheels ship a renamed copy), whose default would be
// every core.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Half.h>
#include <omp.h>
#include <torch/library.h>

#include <algorithm>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kGrain = 1 << 15;  // fewest elements per thread: 32 Ki x 28 B ~ 0.9 MB
constexpr int64_t kAlign = 64;       // block length: threads share no cache line of a stream

// f(lo, hi) over [0, n) in one contiguous block per thread.
template <typename F>
void parallel_blocks(int64_t n, const F& f) {
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), (n + kGrain - 1) / kGrain);
  if (threads <= 1 || at::in_parallel_region()) {
    f(0, n);
    return;
  }
  const int64_t block = ((n + threads - 1) / threads + kAlign - 1) / kAlign * kAlign;
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    const int64_t lo = omp_get_thread_num() * block;
    if (lo < n) f(lo, std::min(n, lo + block));
  }
}

struct Coefs {
  float decay;      // 1 - lr * weight_decay (1 when not decaying: p * 1 is exact)
  float scale;      // per-unit clip coefficient (1 when not clipping)
  float w;          // lerp weight 1 - beta1
  float beta2, c2;  // v = fma(c2 * g, g, v * beta2)
  float bc2_sqrt, eps, neg_step_size;  // neg_step_size = -lr / (1 - beta1^step)
};

inline float load(float x) { return x; }
inline float load(c10::Half x) { return static_cast<float>(x); }
inline float load(c10::BFloat16 x) {
  uint32_t u = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline void store(float* dst, float f) { *dst = f; }
inline void store(c10::Half* dst, float f) { *dst = c10::Half(f); }
inline void store(c10::BFloat16* dst, float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  dst->x = static_cast<uint16_t>(f != f ? 0x7FC0u : rounded);
}

// No copy to write: `run<G, M, NoOut>` stores nothing (out is null).
struct NoOut {};
inline void store(NoOut*, float) {}

// The state before the update, written on the way when a speculative update saves it for a
// rollback (12 B/element more with FP32 moments); null pointers otherwise.
template <typename M>
struct Saved {
  float* p = nullptr;
  M* m = nullptr;
  M* v = nullptr;
};

// The saved state is read again only on a rollback, so its copy bypasses the cache: streaming
// (non-temporal) stores, which also skip the read a plain store of a line not in cache makes
// first (the save's 12 B/element with FP32 moments would move 24). Unaligned ends go by memcpy;
// the caller fences (`_mm_sfence`) once its block is written. Without AVX2, a plain memcpy.
#if defined(__AVX512F__)
constexpr int64_t kStreamBytes = 64;
#elif defined(__AVX2__)
constexpr int64_t kStreamBytes = 32;
#else
constexpr int64_t kStreamBytes = 0;
#endif

inline void stream_copy(void* dst, const void* src, int64_t bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if constexpr (kStreamBytes > 0) {
    const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(d) % kStreamBytes);
    const int64_t head = std::min<int64_t>(bytes, (kStreamBytes - misaligned) % kStreamBytes);
    std::memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    for (; bytes >= kStreamBytes; d += kStreamBytes, s += kStreamBytes, bytes -= kStreamBytes) {
#if defined(__AVX512F__)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d), _mm512_loadu_si512(s));
#elif defined(__AVX2__)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
#endif
    }
  }
  std::memcpy(d, s, bytes);
}

inline void stream_fence() {
#if defined(__AVX512F__) || defined(__AVX2__)
  _mm_sfence();
#endif
}

// A speculative update saves and updates a tile at a time: the tile's state, read for the copy,
// is still in cache when the update reads it.
constexpr int64_t kSaveTile = 2048;

// kLowWeight: w < 0.5, lerp as m + w * (g - m); else g + (w - 1) * (g - m) (as at::vec lerp).
template <bool kLowWeight, typename G, typename M, typename O>
void update_elements(const G* __restrict g, float* __restrict p, M* __restrict m,
                     M* __restrict v, O* __restrict out, int64_t n, Coefs c) {
  const float wc = kLowWeight ? c.w : c.w - 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = load(g[i]) * c.scale;
    const float pi = p[i] * c.decay;
    const float mi0 = load(m[i]);
    const float mi = std::fma(wc, gi - mi0, kLowWeight ? mi0 : gi);
    const float vi = std::fma(c.c2 * gi, gi, load(v[i]) * c.beta2);
    const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
    const float pn = pi + c.neg_step_size * mi / denom;
    p[i] = pn;
    store(m + i, mi);
    store(v + i, vi);
    if constexpr (!std::is_same_v<O, NoOut>) store(out + i, pn);
  }
}

template <bool kLowWeight, bool kSave, typename G, typename M, typename O>
void update_range(const G* g, float* p, M* m, M* v, O* out, Saved<M> saved, int64_t n,
                  Coefs c) {
  if constexpr (!kSave) {
    update_elements<kLowWeight>(g, p, m, v, out, n, c);
  } else {
    for (int64_t lo = 0; lo < n; lo += kSaveTile) {
      const int64_t k = std::min(kSaveTile, n - lo);
      stream_copy(saved.p + lo, p + lo, k * static_cast<int64_t>(sizeof(float)));
      stream_copy(saved.m + lo, m + lo, k * static_cast<int64_t>(sizeof(M)));
      stream_copy(saved.v + lo, v + lo, k * static_cast<int64_t>(sizeof(M)));
      update_elements<kLowWeight>(g + lo, p + lo, m + lo, v + lo, out ? out + lo : nullptr, k, c);
    }
    stream_fence();
  }
}

template <bool kSave, typename G, typename M, typename O>
void run_blocks(const G* gp, float* pp, M* mp, M* vp, O* op, Saved<M> saved, int64_t n,
                const Coefs& c, bool low_weight) {
  parallel_blocks(n, [&](int64_t lo, int64_t hi) {
    O* o = op ? op + lo : nullptr;
    Saved<M> s = saved;
    if constexpr (kSave) s = Saved<M>{saved.p + lo, saved.m + lo, saved.v + lo};
    if (low_weight) {
      update_range<true, kSave>(gp + lo, pp + lo, mp + lo, vp + lo, o, s, hi - lo, c);
    } else {
      update_range<false, kSave>(gp + lo, pp + lo, mp + lo, vp + lo, o, s, hi - lo, c);
    }
  });
}

template <typename G, typename M, typename O>
void run(const at::Tensor& grad, const at::Tensor& master, const at::Tensor& m,
         const at::Tensor& v, const std::optional<at::Tensor>& out, const Coefs& c,
         bool low_weight, const at::Tensor* saved) {
  const G* gp = grad.const_data_ptr<G>();
  float* pp = master.data_ptr<float>();
  M* mp = m.data_ptr<M>();
  M* vp = v.data_ptr<M>();
  O* op = nullptr;
  if constexpr (!std::is_same_v<O, NoOut>) op = out->data_ptr<O>();
  const int64_t n = master.numel();
  if (saved == nullptr) return run_blocks<false>(gp, pp, mp, vp, op, Saved<M>{}, n, c, low_weight);
  const Saved<M> to{saved[0].data_ptr<float>(), saved[1].data_ptr<M>(), saved[2].data_ptr<M>()};
  run_blocks<true>(gp, pp, mp, vp, op, to, n, c, low_weight);
}

template <typename G, typename M>
void dispatch_out(const at::Tensor& grad, const at::Tensor& master, const at::Tensor& m,
                  const at::Tensor& v, const std::optional<at::Tensor>& out, const Coefs& c,
                  bool low, const at::Tensor* saved) {
  if (!out.has_value()) return run<G, M, NoOut>(grad, master, m, v, out, c, low, saved);
  switch (out->scalar_type()) {
    case at::kFloat: return run<G, M, float>(grad, master, m, v, out, c, low, saved);
    case at::kBFloat16: return run<G, M, c10::BFloat16>(grad, master, m, v, out, c, low, saved);
    case at::kHalf: return run<G, M, c10::Half>(grad, master, m, v, out, c, low, saved);
    default: TORCH_CHECK(false, "host_adam: out must be float32, bfloat16 or float16");
  }
}

template <typename G>
void dispatch_moments(const at::Tensor& grad, const at::Tensor& master, const at::Tensor& m,
                      const at::Tensor& v, const std::optional<at::Tensor>& out, const Coefs& c,
                      bool low, const at::Tensor* saved) {
  switch (m.scalar_type()) {
    case at::kFloat: return dispatch_out<G, float>(grad, master, m, v, out, c, low, saved);
    case at::kBFloat16:
      return dispatch_out<G, c10::BFloat16>(grad, master, m, v, out, c, low, saved);
    default: TORCH_CHECK(false, "host_adam: moments must be float32 or bfloat16");
  }
}

void adamw_(const at::Tensor& grad, const at::Tensor& master, const at::Tensor& m,
            const at::Tensor& v, const std::optional<at::Tensor>& out, int64_t step, double lr,
            double beta1, double beta2, double eps, double weight_decay, double grad_scale,
            const std::optional<at::Tensor>& saved_master,
            const std::optional<at::Tensor>& saved_m, const std::optional<at::Tensor>& saved_v) {
  const int64_t n = master.numel();
  for (const at::Tensor* t : {&grad, &master, &m, &v, out ? &*out : &master}) {
    TORCH_CHECK(t->device().is_cpu() && t->is_contiguous() && t->numel() == n,
                "host_adam: every tensor must be a contiguous CPU tensor of ", n, " elements");
  }
  const bool save = saved_master.has_value();
  TORCH_CHECK(save == saved_m.has_value() && save == saved_v.has_value(),
              "host_adam: the saved state is master, m and v, all or none");
  at::Tensor saved_state[3];
  if (save) {
    saved_state[0] = *saved_master;
    saved_state[1] = *saved_m;
    saved_state[2] = *saved_v;
    for (int k = 0; k < 3; ++k) {
      const at::Tensor& t = saved_state[k];
      const at::Tensor& like = k == 0 ? master : m;
      TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.numel() == n &&
                      t.scalar_type() == like.scalar_type(),
                  "host_adam: the saved state must be contiguous CPU tensors like the state");
    }
  }
  const at::Tensor* saved = save ? saved_state : nullptr;
  TORCH_CHECK(master.scalar_type() == at::kFloat, "host_adam: master must be float32");
  TORCH_CHECK(m.scalar_type() == v.scalar_type(), "host_adam: m and v differ in dtype");
  TORCH_CHECK(step >= 1, "host_adam: step must be >= 1");
  // As FusedAdamKernel.cpp: coefficients in double, then one cast to float.
  const double bc1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(beta2, static_cast<double>(step));
  const Coefs c{
      static_cast<float>(weight_decay != 0 ? 1 - lr * weight_decay : 1.0),
      static_cast<float>(grad_scale),
      static_cast<float>(1 - beta1),
      static_cast<float>(beta2),
      static_cast<float>(1 - beta2),
      static_cast<float>(std::sqrt(bc2)),
      static_cast<float>(eps),
      static_cast<float>(-(lr / bc1)),
  };
  const bool low = std::abs(c.w) < 0.5f;
  switch (grad.scalar_type()) {
    case at::kFloat: return dispatch_moments<float>(grad, master, m, v, out, c, low, saved);
    case at::kBFloat16:
      return dispatch_moments<c10::BFloat16>(grad, master, m, v, out, c, low, saved);
    case at::kHalf: return dispatch_moments<c10::Half>(grad, master, m, v, out, c, low, saved);
    default: TORCH_CHECK(false, "host_adam: grad must be float32, bfloat16 or float16");
  }
}

// Sum of squares in double, for a clipping norm: one contiguous block per thread, the blocks'
// sums added in block order (the same bits for the same thread count). One pass over the
// gradient at memory speed; torch's CPU norm of BF16 upcasts on the way at a few GB/s.
// kLanes partial sums, so the adds do not wait on one another (one chain ran at ~1.7 GB/s a
// thread); a 16-bit value's square is exact in float (at most 22 significant bits), so only
// the sum needs double, and float squares vectorise twice as wide.
constexpr int kLanes = 16;

template <typename G>
using Square = std::conditional_t<std::is_same_v<G, float>, double, float>;

template <typename G>
double sumsq_range(const G* g, int64_t n) {
  double s[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const Square<G> x = load(g[i + k]);
      s[k] += static_cast<double>(x * x);
    }
  }
  for (; i < n; ++i) {
    const Square<G> x = load(g[i]);
    s[0] += static_cast<double>(x * x);
  }
  double total = 0;
  for (double part : s) total += part;
  return total;
}

template <typename G>
double sumsq_typed(const at::Tensor& grad) {
  const G* g = grad.const_data_ptr<G>();
  const int64_t n = grad.numel();
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), (n + kGrain - 1) / kGrain);
  if (threads <= 1 || at::in_parallel_region()) return sumsq_range(g, n);
  const int64_t block = ((n + threads - 1) / threads + kAlign - 1) / kAlign * kAlign;
  std::vector<double> parts(threads, 0.0);
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    const int64_t t = omp_get_thread_num();
    const int64_t lo = t * block;
    if (lo < n) parts[t] = sumsq_range(g + lo, std::min(n, lo + block) - lo);
  }
  double total = 0;
  for (double part : parts) total += part;
  return total;
}

double sumsq(const at::Tensor& grad) {
  TORCH_CHECK(grad.device().is_cpu() && grad.is_contiguous(),
              "host_adam: sumsq takes a contiguous CPU tensor");
  switch (grad.scalar_type()) {
    case at::kFloat: return sumsq_typed<float>(grad);
    case at::kBFloat16: return sumsq_typed<c10::BFloat16>(grad);
    case at::kHalf: return sumsq_typed<c10::Half>(grad);
    default: TORCH_CHECK(false, "host_adam: sumsq takes float32, bfloat16 or float16");
  }
}

}  // namespace

TORCH_LIBRARY(slide_host_adam, lib) {
  lib.def(
      "adamw_(Tensor grad, Tensor(a!) master, Tensor(b!) m, Tensor(c!) v, Tensor(d!)? out, "
      "int step, float lr, float beta1, float beta2, float eps, float weight_decay, "
      "float grad_scale, Tensor(e!)? saved_master=None, Tensor(f!)? saved_m=None, "
      "Tensor(g!)? saved_v=None) -> ()");
  lib.def("sumsq(Tensor grad) -> float");
}

TORCH_LIBRARY_IMPL(slide_host_adam, CPU, lib) {
  lib.impl("adamw_", &adamw_);
  lib.impl("sumsq", &sumsq);
}
