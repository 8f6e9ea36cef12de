// CPU kernels of the decode step, compiled for the machine's own CPU on first use
// (kernels/cpu_kernels.py: g++ -O3 -march=native -fopenmp). Plain C entry points over raw pointers
// and small structs, called through ctypes: no torch headers, so a build takes seconds.
//
// Each layer-step kernel does in one call what takes the torch path several ATen ops, and rounds
// where the torch ops it replaces round (results in the model's dtype after each of them), so that
// both paths agree to float rounding. The linear layers on block-quantized weights have no torch
// counterpart: their rounding is their own (see there). `decoder_layer` chains the same stages for
// a whole layer. Threads: OpenMP, which resolves to the libgomp torch has loaded, i.e. the calling
// thread's own team (a second OpenMP runtime would halve decode speed here). The stages are
// written as "team" functions whose loops are orphaned worksharing constructs, so that one body
// serves both a kernel's own parallel region and the layer's single one.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

using bf16 = uint16_t;

inline float to_f(float x) { return x; }
inline float to_f(bf16 x) {
  uint32_t u = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <class T> inline T from_f(float x);
template <> inline float from_f<float>(float x) { return x; }
template <> inline bf16 from_f<bf16>(float x) {  // round to nearest even, as torch does
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16(u >> 16);
}

// 2^x, relative error ~1e-8 (below float's ulp): 2^n times a degree-7 Taylor polynomial of 2^f on
// f in [-0.5, 0.5]. Written to vectorize; libm's exp2f does not, and exp would cost ~3x (see
// kernels/paged_attention.py).
inline float exp2_fast(float x) {
  x = std::min(std::max(x, -126.0f), 127.0f);
  float n = std::floor(x + 0.5f);
  float f = x - n;
  float p = 1.525273380405984e-05f;
  p = p * f + 1.5403530393381606e-04f;
  p = p * f + 1.3333558146428443e-03f;
  p = p * f + 9.618129107628477e-03f;
  p = p * f + 5.550410866482158e-02f;
  p = p * f + 2.402265069591007e-01f;
  p = p * f + 6.931471805599453e-01f;
  p = p * f + 1.0f;
  int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

constexpr float LOG2_E = 1.4426950408889634f;

// x += delta (when delta is given; a row of the float32 residual stream), then
// out = T(x / sqrt(mean(x^2) + eps) * w). delta may be out: it is read before out is written.
template <class T>
inline void add_rms_norm_row(float* x, const T* delta, const float* w, T* out, int64_t d, float eps) {
  if (delta != nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) x[i] += to_f(delta[i]);
  }
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / float(d) + eps);
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) out[i] = from_f<T>(x[i] * inv * w[i]);
}

template <class T>
void add_rms_norm(float* x, const T* delta, int64_t delta_stride, const float* w, T* out, int64_t rows,
                  int64_t d, float eps) {
#pragma omp parallel for if (rows >= 16)
  for (int64_t r = 0; r < rows; ++r)
    add_rms_norm_row(x + r * d, delta == nullptr ? nullptr : delta + r * delta_stride, w, out + r * d, d, eps);
}

// Qwen3's q/k norms in place on a row [q heads | k heads | ...] of d values each: each head's RMS
// norm times its weight (the separate calls' `rs_head_rms_norms` and the fused layer's own)
inline void head_rms_norms(float* row, int64_t heads, int64_t kv_heads, int64_t d, const float* q_norm,
                           const float* k_norm, float eps) {
  for (int64_t h = 0; h < heads + kv_heads; ++h)
    add_rms_norm_row<float>(row + h * d, nullptr, h < heads ? q_norm : k_norm, row + h * d, d, eps);
}

// Rotary embedding in place on `heads` heads of d values, back to back (rotate-half layout), with
// rows c, s of the tables of runtime/models/rope.py: cos twice, then -sin and sin.
template <class T>
inline void rope_row(T* x, int64_t heads, int64_t d, const T* c, const T* s) {
  const int64_t half = d / 2;
  float buf[512];
  for (int64_t h = 0; h < heads; ++h) {
    T* v = x + h * d;
    for (int64_t i = 0; i < d; ++i) buf[i] = to_f(v[i]);
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) {
      const float rolled = buf[i < half ? i + half : i - half];
      // x * cos rounds to T before the add, as torch.addcmul(x * cos, roll(x), sin) does
      v[i] = from_f<T>(to_f(from_f<T>(buf[i] * to_f(c[i]))) + rolled * to_f(s[i]));
    }
  }
}

template <class T>
void rope(T* x, int64_t row_stride, int64_t rows, int64_t heads, int64_t d, const T* cos, const T* sin,
          const int64_t* positions) {
#pragma omp parallel for if (rows >= 16)
  for (int64_t r = 0; r < rows; ++r)
    rope_row(x + r * row_stride, heads, d, cos + positions[r] * d, sin + positions[r] * d);
}

#if defined(__AVX2__) && defined(__FMA__)
// exp2_fast on eight lanes, the same operations in the same order (no fused multiply-adds), so
// that a value gives the same bits in either
inline __m256 exp2_fast8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-126.0f)), _mm256_set1_ps(127.0f));
  const __m256 n = _mm256_floor_ps(_mm256_add_ps(x, _mm256_set1_ps(0.5f)));
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.525273380405984e-05f);
  for (float c : {1.5403530393381606e-04f, 1.3333558146428443e-03f, 9.618129107628477e-03f, 5.550410866482158e-02f,
                  2.402265069591007e-01f, 6.931471805599453e-01f, 1.0f})
    p = _mm256_add_ps(_mm256_mul_ps(p, f), _mm256_set1_ps(c));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
#endif

// out = T(T(silu(g)) * u) over `inter` values. float32 rows go eight at a time by hand (GCC left
// this loop scalar, pragma or not), with the same bits as the scalar loop, which takes the rest
template <class T>
inline void silu_mul_row(const T* g, const T* u, T* out, int64_t inter) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same<T, float>::value) {
    const __m256 sign = _mm256_set1_ps(-0.0f), log2e = _mm256_set1_ps(LOG2_E), one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= inter; i += 8) {
      const __m256 a = _mm256_loadu_ps(g + i);
      const __m256 e = exp2_fast8(_mm256_mul_ps(_mm256_xor_ps(a, sign), log2e));
      _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(a, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
  }
#endif
  for (; i < inter; ++i) {
    const float a = to_f(g[i]);
    const T silu = from_f<T>(a / (1.0f + exp2_fast(-a * LOG2_E)));
    out[i] = from_f<T>(to_f(silu) * to_f(u[i]));
  }
}

// rows [gate | up] of width 2 * inter
template <class T>
void silu_mul(const T* gate_up, int64_t rows, int64_t inter, T* out) {
#pragma omp parallel for if (rows >= 16)
  for (int64_t r = 0; r < rows; ++r)
    silu_mul_row(gate_up + r * 2 * inter, gate_up + r * 2 * inter + inter, out + r * inter, inter);
}

// Rows of k and v (`width` contiguous values each, rows k_stride / v_stride apart) to cache slots
template <class T>
void write_kv(T* k_cache, T* v_cache, const int64_t* slots, const T* k, int64_t k_stride, const T* v,
              int64_t v_stride, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(k_cache + slots[r] * width, k + r * k_stride, width * sizeof(T));
    std::memcpy(v_cache + slots[r] * width, v + r * v_stride, width * sizeof(T));
  }
}

// The two passes of an item over its tokens, for a tile of queries reading the same KV head
// (q: float32 [d], times the softmax scale in base 2; rows[j]: token j's K or V row of that head):
//   scores[i][j] = dot(q[i], K_j)             tile_scores
//   out[i][e] = sum_j weights[i][j] * V_j[e]  tile_values
// Vectorised where the head dim is a multiple of 8; the portable loops otherwise.
#if defined(__AVX2__) && defined(__FMA__)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// exp2_fast on eight lanes (the same polynomial, with fused multiply-adds)
inline __m256 exp2_8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-126.0f)), _mm256_set1_ps(127.0f));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.525273380405984e-05f);
  for (float c : {1.5403530393381606e-04f, 1.3333558146428443e-03f, 9.618129107628477e-03f, 5.550410866482158e-02f,
                  2.402265069591007e-01f, 6.931471805599453e-01f, 1.0f})
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// s[j] = 2^(s[j] - max s); returns (max, sum)
inline void softmax_weights(float* s, int64_t n, float* top_out, float* sum_out) {
  __m256 m8 = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(s + j));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  float top = std::max(_mm_cvtss_f32(m4), _mm_cvtss_f32(_mm_movehdup_ps(m4)));
  for (; j < n; ++j) top = std::max(top, s[j]);
  const __m256 t8 = _mm256_set1_ps(top);
  __m256 sum8 = _mm256_setzero_ps();
  for (j = 0; j + 8 <= n; j += 8) {
    const __m256 e = exp2_8(_mm256_sub_ps(_mm256_loadu_ps(s + j), t8));
    _mm256_storeu_ps(s + j, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  float sum = hsum(sum8);
  for (; j < n; ++j) sum += (s[j] = exp2_fast(s[j] - top));
  *top_out = top;
  *sum_out = sum;
}

// NV vectors of the head dim from offset c: q stays in registers, four tokens' dots at a time
// (one reduction for all four: a dot a token would spend more on its horizontal sum than on it)
// Calls f(std::integral_constant<int, v>) for a runtime v in 1..8: the tiles below keep their
// sums in registers, which needs their sizes known when compiled
template <class F>
inline void with_size(int64_t v, F f) {
  switch (v) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

// A tile is QT (<= 4) queries that read the same K/V rows: the heads of a KV head group, of one
// or more members. Each row is loaded once for all of them (a head at a time would read each
// row group-size times, from L2: the reads, not the multiply-adds, bounded that version).
//   scores[i][j] (+)= dot(q[i][c..], K_j[c..]) over NV vectors from offset c
template <class T, int QT, int NV>
void scores_tile(const float* const* q, const T* const* rows, int64_t n, int64_t c, bool first,
                 float* const* scores) {
  // the queries' vectors side by side (one base address), zero past QT: two tokens' four sums
  // each reduce in one tree
  alignas(32) float qb[4][NV * 8];
  for (int i = 0; i < 4; ++i)
    for (int e = 0; e < NV * 8; ++e) qb[i][e] = i < QT ? q[i][c + e] : 0.f;
  for (int64_t j = 0; j < n; j += 2) {
    const T* r0 = rows[j] + c;
    const T* r1 = rows[std::min(j + 1, n - 1)] + c;
    __m256 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
    for (int v = 0; v < NV; ++v) {
      const __m256 k0 = load8(r0 + 8 * v), k1 = load8(r1 + 8 * v);
      for (int i = 0; i < QT; ++i) {
        const __m256 qv = _mm256_load_ps(qb[i] + 8 * v);
        a[i] = _mm256_fmadd_ps(qv, k0, a[i]);
        a[4 + i] = _mm256_fmadd_ps(qv, k1, a[4 + i]);
      }
    }
    // [t0: q0 q1 q2 q3 | t1: q0 q1 q2 q3]
    const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    const __m256 both = _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
    alignas(32) float sums[8];
    _mm256_store_ps(sums, both);
    for (int i = 0; i < QT; ++i) {
      scores[i][j] = first ? sums[i] : scores[i][j] + sums[i];
      if (j + 1 < n) scores[i][j + 1] = first ? sums[4 + i] : scores[i][j + 1] + sums[4 + i];
    }
  }
}

//   out[i][c..] = sum_j weights[i][j] * V_j[c..] over NV vectors from offset c
template <class T, int QT, int NV>
void values_tile(const float* const* weights, const T* const* rows, int64_t n, int64_t c, float* const* out) {
  __m256 acc[QT][NV];
  for (int i = 0; i < QT; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const T* r = rows[j] + c;
    __m256 w[QT];
    for (int i = 0; i < QT; ++i) w[i] = _mm256_broadcast_ss(weights[i] + j);
    for (int v = 0; v < NV; ++v) {
      const __m256 x = load8(r + 8 * v);
      for (int i = 0; i < QT; ++i) acc[i][v] = _mm256_fmadd_ps(w[i], x, acc[i][v]);
    }
  }
  for (int i = 0; i < QT; ++i)
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(out[i] + c + 8 * v, acc[i][v]);
}

template <class T>
bool tile_scores_vector(int64_t qt, const float* const* q, const T* const* rows, int64_t n, int64_t d,
                        float* const* scores) {
  if (d % 8 != 0) return false;
  with_size(qt, [&](auto qt_c) {
    for (int64_t c = 0; c < d; c += 64)
      with_size(std::min<int64_t>(8, (d - c) / 8), [&](auto nv) {
        scores_tile<T, decltype(qt_c)::value, decltype(nv)::value>(q, rows, n, c, c == 0, scores);
      });
  });
  return true;
}

template <class T>
bool tile_values_vector(int64_t qt, const float* const* weights, const T* const* rows, int64_t n, int64_t d,
                        float* const* out) {
  if (d % 8 != 0) return false;
  with_size(qt, [&](auto qt_c) {
    constexpr int QT = decltype(qt_c)::value, CHUNK = QT == 1 ? 8 : QT == 4 ? 2 : 4;  // QT * CHUNK sums
    for (int64_t c = 0; c < d; c += 8 * CHUNK)
      with_size(std::min<int64_t>(CHUNK, (d - c) / 8), [&](auto nv) {
        values_tile<T, QT, decltype(nv)::value>(weights, rows, n, c, out);
      });
  });
  return true;
}
#else
template <class T>
bool tile_scores_vector(int64_t, const float* const*, const T* const*, int64_t, int64_t, float* const*) {
  return false;
}
template <class T>
bool tile_values_vector(int64_t, const float* const*, const T* const*, int64_t, int64_t, float* const*) {
  return false;
}
inline void softmax_weights(float* s, int64_t n, float* top_out, float* sum_out) {
  float top = s[0];
  for (int64_t j = 1; j < n; ++j) top = std::max(top, s[j]);
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) sum += (s[j] = exp2_fast(s[j] - top));
  *top_out = top;
  *sum_out = sum;
}
#endif

template <class T>
void tile_scores(int64_t qt, const float* const* q, const T* const* rows, int64_t n, int64_t d, float* const* scores) {
  if (tile_scores_vector(qt, q, rows, n, d, scores)) return;
  for (int64_t i = 0; i < qt; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t e = 0; e < d; ++e) s = std::fma(q[i][e], to_f(rows[j][e]), s);
      scores[i][j] = s;
    }
}

template <class T>
void tile_values(int64_t qt, const float* const* weights, const T* const* rows, int64_t n, int64_t d,
                 float* const* out) {
  if (tile_values_vector(qt, weights, rows, n, d, out)) return;
  for (int64_t i = 0; i < qt; ++i) {
    std::fill(out[i], out[i] + d, 0.f);
    for (int64_t j = 0; j < n; ++j)
#pragma omp simd
      for (int64_t e = 0; e < d; ++e) out[i][e] = std::fma(weights[i][j], to_f(rows[j][e]), out[i][e]);
  }
}

// Decode attention read straight from the KV pages, planned by runtime/attention_cpu.py
// (kernels/cpu_kernels.py's DecodePlan and PagedDecodeArgs, which mirror this struct):
// - an item scores the queries of its members (one for a request's own tokens; every member of a
//   group for a cached prefix they share, so those pages are read once for all of them) against
//   the tokens [start, end) of page-table row `page_row`, and leaves per member and head the
//   unnormalised sum of weighted values, the max score and the sum of weights (base 2) in the
//   member's partial slot (slot i for member i): items = [n_items, 5] (page_row, start, end,
//   first member, members), members = the query row of each member;
// - then each query row merges its slots (slots[slot_start[b] .. slot_start[b + 1]]) by their
//   maxima into out[b].
struct PagedDecode {
  const void* k_cache;    // [layers, slots, kv_heads, d] in the model's dtype
  const void* v_cache;
  int64_t layer_stride;   // values between two layers' caches
  const int64_t* table;   // page table [requests, table_stride]
  int64_t table_stride, page_size;
  const int32_t* items;
  int64_t n_items;
  const int32_t* members;
  const int32_t* slot_start;
  const int32_t* slots;
  float* partials;        // [n_slots, heads, d + 2] float32 scratch
  int64_t max_members, max_scores, max_tokens;  // the largest item's
  int64_t heads, kv_heads, d;
  float scale;
};

// Rows [0, n) of `bytes` each read once, a load a cache line, in order: the memory streams them
// (a row at a time into L1, then L2), where strided reads of a slice each would wait
template <class T>
inline void read_rows(const T* const* rows, int64_t n, int64_t bytes) {
  uint64_t sink = 0;
  for (int64_t j = 0; j < n; ++j) {
    const char* r = reinterpret_cast<const char*>(rows[j]);
    for (int64_t o = 0; o < bytes; o += 64) {
      uint64_t v;
      std::memcpy(&v, r + o, 8);
      sink ^= v;
    }
  }
  asm volatile("" : : "r"(sink));
}

// Called by every thread of a team (the loops are orphaned worksharing constructs): q [rows,
// heads, d] with rows q_stride apart -> out [rows, heads, d], against layer `layer`'s caches.
// sinks (or null): [heads] logits that join each head's softmax and weigh no value (gpt-oss), at
// the merge, where every item's maximum and sum meet
template <class T>
void decode_attention_team(const PagedDecode& p, int64_t layer, const T* q, int64_t q_stride, int64_t rows,
                           const float* sinks, T* out) {
  const int64_t heads = p.heads, d = p.d, group = heads / p.kv_heads, width = p.kv_heads * d, pw = d + 2;
  const T* k_cache = static_cast<const T*>(p.k_cache) + layer * p.layer_stride;
  const T* v_cache = static_cast<const T*>(p.v_cache) + layer * p.layer_stride;
  const float scale2 = p.scale * LOG2_E;
  float* scores = static_cast<float*>(std::malloc(sizeof(float) * (p.max_scores + p.max_members * heads * d)));
  float* qf = scores + p.max_scores;
  const T** k_rows = static_cast<const T**>(std::malloc(sizeof(T*) * 2 * (p.max_tokens + 1)));
  const T** v_rows = k_rows + p.max_tokens + 1;
#pragma omp for schedule(dynamic, 1)
  for (int64_t it = 0; it < p.n_items; ++it) {
    const int32_t* item = p.items + it * 5;
    const int64_t* pages = p.table + int64_t(item[0]) * p.table_stride;
    const int64_t start = item[1], end = item[2], n = end - start, m0 = item[3], nm = item[4];
    for (int64_t m = 0; m < nm; ++m) {
      const T* qm = q + int64_t(p.members[m0 + m]) * q_stride;
      for (int64_t i = 0; i < heads * d; ++i) qf[m * heads * d + i] = to_f(qm[i]) * scale2;
    }
    // the item's K rows read once, in order, before any KV head's pass (each pass reads 256 bytes
    // of every 2 KB row, which left the loads waiting on memory one stride at a time: attention ran
    // at ~10 GB/s of K/V, a third of a plain read's; asking for the rows with prefetches at the
    // item's start did no better), then its V rows likewise before the values: the passes then
    // read L2. A 1B step's attention (16 layers), 1.8 -> 1.0-1.4 ms at 170 tokens and 4.6 -> 2.9 ms
    // at 600, the same bits (alternating runs of a stage-timed /tmp build of the fused layer)
    const auto rows_of = [&](const T* cache, int64_t g, const T** out) {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t t = start + j, slot = pages[t / p.page_size] * p.page_size + t % p.page_size;
        out[j] = cache + slot * width + g * d;
      }
    };
    const int64_t nq = nm * group;  // the queries reading a KV head: every member's heads of its group
    const auto tiles = [&](int64_t g, auto&& f) {  // in tiles of four
      for (int64_t i0 = 0; i0 < nq; i0 += 4) {
        const int64_t qt = std::min<int64_t>(4, nq - i0);
        const float* qs[4];
        float* ss[4];
        float* parts[4];
        for (int64_t i = 0; i < qt; ++i) {
          const int64_t m = (i0 + i) / group, h = g * group + (i0 + i) % group;
          qs[i] = qf + (m * heads + h) * d;
          ss[i] = scores + (m * heads + h) * n;
          parts[i] = p.partials + ((m0 + m) * heads + h) * pw;
        }
        f(qt, qs, ss, parts);
      }
    };
    rows_of(k_cache, 0, k_rows);
    read_rows(k_rows, n, width * int64_t(sizeof(T)));
    for (int64_t g = 0; g < p.kv_heads; ++g) {
      rows_of(k_cache, g, k_rows);
      tiles(g, [&](int64_t qt, const float* const* qs, float* const* ss, float* const* parts) {
        tile_scores(qt, qs, k_rows, n, d, ss);
        for (int64_t i = 0; i < qt; ++i) softmax_weights(ss[i], n, parts[i] + d, parts[i] + d + 1);
      });
    }
    rows_of(v_cache, 0, v_rows);
    read_rows(v_rows, n, width * int64_t(sizeof(T)));
    for (int64_t g = 0; g < p.kv_heads; ++g) {
      rows_of(v_cache, g, v_rows);
      tiles(g, [&](int64_t qt, const float* const*, float* const* ss, float* const* parts) {
        tile_values(qt, const_cast<const float* const*>(ss), v_rows, n, d, parts);
      });
    }
  }
  std::free(k_rows);
  std::free(scores);
#pragma omp for
  for (int64_t bh = 0; bh < rows * heads; ++bh) {
    const int64_t b = bh / heads, h = bh % heads;
    const float sink = sinks != nullptr ? sinks[h] * LOG2_E : -INFINITY;  // base 2, as the scores
    float top = sink;
    for (int32_t j = p.slot_start[b]; j < p.slot_start[b + 1]; ++j)
      top = std::max(top, p.partials[(p.slots[j] * heads + h) * pw + d]);
    float acc[512] = {0.f};
    float sum = sinks != nullptr ? exp2_fast(sink - top) : 0.f;
    for (int32_t j = p.slot_start[b]; j < p.slot_start[b + 1]; ++j) {
      const float* part = p.partials + (int64_t(p.slots[j]) * heads + h) * pw;
      const float w = exp2_fast(part[d] - top);
      sum += part[d + 1] * w;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) acc[i] += part[i] * w;
    }
    T* o = out + b * heads * d + h * d;
    for (int64_t i = 0; i < d; ++i) o[i] = from_f<T>(acc[i] / sum);
  }
}


// ---- linear layers on block-quantized weights, as a GGUF file stores them -------------------------
// The file's own bytes (memory-mapped, never copied: runtime/models/quant.py) in seven block types:
// Q4_0, Q4_1, Q8_0 (blocks of 32 with an f16 scale), MXFP4 (32 with an e8m0 exponent) and the
// K-quants Q4_K, Q5_K, Q6_K (super-blocks
// of 256: eight sub-blocks of 32 with 6- or 8-bit scales under an f16 one). Every type is read a
// sub-block of 32 at a time as 32 small integers q, one float scale and one float zero:
//   w = scale * q + zero   (Q6_K: q already carries its two 8-bit sub-scales, see there)
// The activations are rounded per block of 32 to int8 (x = xq * xscale, as llama.cpp's dot
// products round them: half a step of 1/127 of the block's largest), so that a sub-block's dot is
// exact in int32: u8 x s8 multiply-adds, 32 weights an instruction pair (maddubs + madd; one
// dpbusd where VNNI is present). y = sum_b scale_b * xscale_b * dot(q_b, xq_b) + zero_b * sum(x_b):
// the legacy types' zero term takes the rounded block's sum (xscale * its int8 sum, llama.cpp's
// q8_1), so every weight meets the same rounded activations. Q4_K / Q5_K, as llama.cpp does, take
// their mins against the int8 sums of x: a K-quant super-block is two integers, S (its
// dot) and M (mins times block sums; none for Q6_K), and a token's float sum is the same
// operations on them in every tile (krow, ktile), so that a row's result does not depend on the
// batch it is in. A super-block's header is decoded once for all the activation rows a tile holds.
constexpr int64_t QBLOCK = 32;
constexpr int64_t QK = 256;   // a K-quant super-block

// Activation rows [n, cols] as the block kernels read them (QuantizedRows holds them): int8 per
// block of 32 with its float scale (x = xq * xscale) and sum (xscale * its int8 sum), for the
// legacy types; and,
// where cols is a multiple of 256, int8 per super-block of 256 with one scale, for the K-quants,
// whose eight sub-block dots then add up in int32 before one float multiply-add (llama.cpp's
// Q8_K), with the integer sums of those int8 blocks (and of their halves, for Q6_K) for the
// K-quants' zeros and offsets. The scaled block sums serve the legacy types' zeros.
// Where several rows multiply a legacy-type matrix, the rows are also interleaved in groups of eight
// (matmul_team builds them): group g, block b is 256 bytes, chunk c (values 4c..4c+3) holding row
// 8g + t's four at bytes 4t..4t+3; then the group's block scales and sums as eight floats, row t in
// lane t. One weight row's four bytes, broadcast, then meet eight rows in one multiply.
struct Acts {
  const int8_t* xq;
  const float* xscale;
  const float* xsum;
  const int8_t* xq256;
  const float* xscale256;
  const int16_t* xbsum256;  // [n][cols / 32] the integer sums of xq256's blocks of 32
  const int16_t* xb16;      // [n][cols / 16] and of its halves (Q6_K's sub-scales cover 16)
  int64_t cols;
  int8_t* xi;       // [groups][cols / 32][256]
  float* xi_scale;  // [groups][cols / 32][8]
  float* xi_sum;    // [groups][cols / 32][8]
  int8_t* xk;       // xq256 interleaved as xi interleaves xq
  float* xk_scale;  // [groups][cols / 256][8]
  int16_t* xk_bsum; // [groups][cols / 256][4][8][2]: sub-blocks 2p, 2p + 1 of row 8g + t at [p][t]
  int16_t* xk_b16;  // [groups][cols / 256][8][8][2]: halves of sub-block p of row 8g + t at [p][t]
};

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);  // inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    uint32_t m = man;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400u) == 0);
    bits = sign | (uint32_t(112 - e) << 23) | ((m & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A super-block's decoded header: each sub-block's float scale and zero, and Q6_K's integer
// sub-scales (two a sub-block, one per 16 weights)
template <int SUBS>
struct Header {
  float scale[SUBS], zero[SUBS];
  float d;            // the K-quants' super-block factor of their integer sub-scales
  float dmin;         // Q4_K / Q5_K: the super-block factor of their integer mins
  int32_t isc[SUBS];  // Q4_K / Q5_K: sub-block j's 6-bit scale (Q6_K's q carries its own)
  int32_t imin[SUBS]; // Q4_K / Q5_K: sub-block j's 6-bit min
};

// the 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block (12 packed bytes)
inline void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Each type: SUBS sub-blocks of 32 in BYTES bytes; header(); q(p, j, l), the integer of weight l of
// sub-block j that the dot multiplies (the portable loops and the tests' reference); dequantize(),
// float32 weights in the order and rounding of the gguf package's numpy reference (bit for bit);
// and, with AVX2, weights(p, j) (the sub-block's 32 integers in a vector) and dot(w, x, header, j).
struct Q4_0 {
  static constexpr int SUBS = 1, BYTES = 18;
  static constexpr bool ZERO = true;
  static void header(const uint8_t* p, Header<1>& h) {
    h.scale[0] = half_to_float(p);
    h.zero[0] = -8.0f * h.scale[0];
  }
  static int32_t q(const uint8_t* p, int, int l) { return l < 16 ? p[2 + l] & 0x0F : p[2 + l - 16] >> 4; }
  static void dequantize(const uint8_t* p, float* y) {
    const float d = half_to_float(p);
    for (int l = 0; l < 32; ++l) y[l] = d * float(q(p, 0, l) - 8);
  }
};
struct Q4_1 {
  static constexpr int SUBS = 1, BYTES = 20;
  static constexpr bool ZERO = true;
  static void header(const uint8_t* p, Header<1>& h) {
    h.scale[0] = half_to_float(p);
    h.zero[0] = half_to_float(p + 2);
  }
  static int32_t q(const uint8_t* p, int, int l) { return l < 16 ? p[4 + l] & 0x0F : p[4 + l - 16] >> 4; }
  static void dequantize(const uint8_t* p, float* y) {
    const float d = half_to_float(p), m = half_to_float(p + 2);
    for (int l = 0; l < 32; ++l) y[l] = d * float(q(p, 0, l)) + m;
  }
};
struct Q8_0 {
  static constexpr int SUBS = 1, BYTES = 34;
  static constexpr bool ZERO = false;
  static void header(const uint8_t* p, Header<1>& h) {
    h.scale[0] = half_to_float(p);
    h.zero[0] = 0.f;
  }
  static int32_t q(const uint8_t* p, int, int l) { return int8_t(p[2 + l]); }
  static void dequantize(const uint8_t* p, float* y) {
    const float d = half_to_float(p);
    for (int l = 0; l < 32; ++l) y[l] = d * float(q(p, 0, l));
  }
};
// MXFP4 (gpt-oss's experts): an e8m0 exponent byte, then Q4_0's nibble layout of 4-bit e2m1 codes.
// Its codes are doubled to the integers kMxfp4 (e2m1 halves: 0 .. 6 in steps of 0.5 are 0 .. 12)
// and the exponent halved: w = 2^(e - 128) * kMxfp4[code], exactly, every e (e < 2: subnormal).
// The kernels read it as Q4_0 reads its nibbles: q = kMxfp4[code] + 12 in 0 .. 24, unsigned, with
// the zero -12 * d (u8 x s8 products then need no sign trick, and add up in int16 four chunks at
// a time: 2 * 4 * 24 * 127 < 2^15)
constexpr int8_t kMxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
alignas(16) constexpr uint8_t kMxfp4Offset[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
struct E8M0Table {
  uint32_t bits[256];
};
constexpr E8M0Table make_e8m0() {
  E8M0Table t{};
  for (uint32_t e = 0; e < 256; ++e) t.bits[e] = e < 2 ? 0x00200000u << e : (e - 1) << 23;
  return t;
}
alignas(64) constexpr E8M0Table kE8M0 = make_e8m0();  // float bits of 2^(e - 128)
inline float e8m0_half(uint8_t e) {
  float f;
  std::memcpy(&f, &kE8M0.bits[e], 4);
  return f;
}
struct MXFP4 {
  static constexpr int SUBS = 1, BYTES = 17;
  static constexpr bool ZERO = true;
  static void header(const uint8_t* p, Header<1>& h) {
    h.scale[0] = e8m0_half(p[0]);
    h.zero[0] = -12.0f * h.scale[0];
  }
  static int32_t code(const uint8_t* p, int l) { return l < 16 ? p[1 + l] & 0x0F : p[1 + l - 16] >> 4; }
  static int32_t q(const uint8_t* p, int, int l) { return kMxfp4Offset[code(p, l)]; }
  static void dequantize(const uint8_t* p, float* y) {
    const float d = e8m0_half(p[0]);
    for (int l = 0; l < 32; ++l) y[l] = d * float(kMxfp4[code(p, l)]);
  }
};
// Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of 4-bit q; the 32 bytes of
// sub-blocks 2i and 2i + 1 hold the first in their low nibbles, the second in their high ones.
// w = d * sc_j * q - dmin * m_j
struct Q4_K {
  static constexpr int SUBS = 8, BYTES = 144;
  static constexpr bool ZERO = true;
  static void header(const uint8_t* p, Header<8>& h) {
    const float d = half_to_float(p), dmin = half_to_float(p + 2);
    h.d = d;
    h.dmin = dmin;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      scale_min_k4(j, p + 4, sc, m);
      h.scale[j] = d * float(sc);
      h.zero[j] = -(dmin * float(m));
      h.isc[j] = sc;
      h.imin[j] = m;
    }
  }
  static int32_t q(const uint8_t* p, int j, int l) {
    const uint8_t b = p[16 + 32 * (j / 2) + l];
    return j % 2 == 0 ? b & 0x0F : b >> 4;
  }
  static void dequantize(const uint8_t* p, float* y);
};
// Q5_K: Q4_K's layout plus 32 bytes of fifth bits (bit j of byte l: weight l of sub-block j)
struct Q5_K {
  static constexpr int SUBS = 8, BYTES = 176;
  static constexpr bool ZERO = true;
  static void header(const uint8_t* p, Header<8>& h) { Q4_K::header(p, h); }
  static int32_t q(const uint8_t* p, int j, int l) {
    const uint8_t b = p[48 + 32 * (j / 2) + l];
    return (j % 2 == 0 ? b & 0x0F : b >> 4) | (((p[16 + l] >> j) & 1) << 4);
  }
  static void dequantize(const uint8_t* p, float* y);
};
// Q4_K / Q5_K weights: (d * sc) * q - dmin * m per sub-block, the reference's order of rounding
template <class K>
inline void k4_dequantize(const uint8_t* p, float* y) {
  Header<8> h;
  K::header(p, h);
  for (int j = 0; j < 8; ++j)
    for (int l = 0; l < 32; ++l) y[32 * j + l] = h.scale[j] * float(K::q(p, j, l)) + h.zero[j];
}
void Q4_K::dequantize(const uint8_t* p, float* y) { k4_dequantize<Q4_K>(p, y); }
void Q5_K::dequantize(const uint8_t* p, float* y) { k4_dequantize<Q5_K>(p, y); }
// Q6_K: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (one per 16 weights), f16
// d. w = d * sc * (u - 32), u in 0..63. Sub-block j = 4h + k of half h: low nibbles of bytes
// 64h + 32(k % 2) + l for k < 2, high ones for k >= 2; bits 2k, 2k + 1 of byte 32h + l of the
// pairs; scales 8h + 2k (weights 0..15) and 8h + 2k + 1 (16..31). Its q is sc * (u - 32): the
// integer dot carries the sub-scales, the float scale is d.
struct Q6_K {
  static constexpr int SUBS = 8, BYTES = 210;
  static constexpr bool ZERO = false;
  static void header(const uint8_t* p, Header<8>& h) {
    const float d = half_to_float(p + 208);
    h.d = d;
    h.dmin = 0.f;
    for (int j = 0; j < 8; ++j) {
      h.scale[j] = d;
      h.zero[j] = 0.f;
      h.isc[j] = 1;
    }
  }
  static int32_t u(const uint8_t* p, int j, int l) {
    const int half = j / 4, k = j % 4;
    const uint8_t lo = p[64 * half + 32 * (k % 2) + l];
    const int nib = k < 2 ? lo & 0x0F : lo >> 4;
    return nib | (((p[128 + 32 * half + l] >> (2 * k)) & 3) << 4);
  }
  static int32_t q(const uint8_t* p, int j, int l) {
    const int s = 8 * (j / 4) + 2 * (j % 4) + l / 16;
    return int8_t(p[192 + s]) * (u(p, j, l) - 32);
  }
  static void dequantize(const uint8_t* p, float* y) {
    const float d = half_to_float(p + 208);
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l) {
        const int s = 8 * (j / 4) + 2 * (j % 4) + l / 16;
        y[32 * j + l] = (d * float(int8_t(p[192 + s]))) * float(u(p, j, l) - 32);
      }
  }
};

// Q4_K / Q5_K: integer mins under a float dmin, whose term takes the integer sums of x's blocks
template <class K>
constexpr bool kmins = K::SUBS == 8 && K::ZERO;

// One- and two-token steps read each weight row once and ask the memory for the row PREFETCH_ROWS
// ahead: the hardware prefetcher alone left the 8-bit LM head waiting on memory
// (bench/decode_floor.py's "linear layers + LM head"). A row longer than PREFETCH_BURST_BYTES is
// asked for a group of blocks at a time as the tile reads its own group, into L2: the whole row at
// its start stalled the loads behind a burst of up to 126 requests (on a Zen 4 EPYC, one token
// from memory: 19.3 against 33.9 GB/s on an 8B down projection, 22.0 against 34.1 on a 1B one;
// bench/gemm.py --prefetch --from-memory). Shorter rows (the default model's) are still asked for
// at once, which left them ~10% faster than a group at a time.
#ifndef RS_PREFETCH_ROWS
#define RS_PREFETCH_ROWS 8
#endif
constexpr int64_t PREFETCH_ROWS = RS_PREFETCH_ROWS;
#ifndef RS_PREFETCH_BURST_BYTES
#define RS_PREFETCH_BURST_BYTES 1024
#endif
constexpr int64_t PREFETCH_BURST_BYTES = RS_PREFETCH_BURST_BYTES;
// (inlined always: a call would spill the tiles' vector registers, which halved the long-row speed)
__attribute__((always_inline)) inline void prefetch_span(const char* ahead, int64_t from, int64_t to) {
  if (ahead != nullptr)
    for (int64_t o = from; o < to; o += 64) __builtin_prefetch(ahead + o, 0, 2);
}

#if defined(__AVX2__) && defined(__FMA__)
// sums of four u8 x s8 products into each int32 lane (no saturation: every caller's u8 <= 128 and
// |s8| <= 127, so a maddubs pair stays within int16)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define RS_VNNI 1
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
#elif defined(__AVXVNNI__)
#define RS_VNNI 1
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#else
#define RS_VNNI 0
#endif
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if RS_VNNI
  return dpbusd(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
inline float half_f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
inline __m256i nibbles32(const uint8_t* p) {  // 16 bytes -> their 16 low nibbles, then their 16 high ones
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
}
inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256i k_nibbles(const uint8_t* p, int j) {  // sub-block j's nibbles of a K-quant's 128 bytes
  const __m256i v = load32(p + 32 * (j / 2));
  return _mm256_and_si256(j % 2 == 0 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
}

// A super-block's header in registers: the float factor of its integer dots, the K-quants'
// integer sub-scales as int16 (broadcast per 128-bit lane; sub_scale() picks sub-block j's), Q4_K /
// Q5_K's integer mins as int16 and their float factor, or a legacy block's zero
struct VHeader {
  float d, zero, dmin;
  __m256i scales[2];
  __m128i mins;
};
// shuffle_epi8 controls over 256 bits, whole constants (a pair of 128-bit loads joined by an
// insert was rebuilt in krow's loop): all[j] puts int16 lane j of each 128-bit lane in all eight of
// its lanes; pair[k], lane 2k in the low 128 bits and lane 2k + 1 in the high ones
struct LaneControls {
  uint8_t all[8][32], pair[4][32];
};
constexpr LaneControls lane_controls() {
  LaneControls c{};
  for (int i = 0; i < 32; ++i) {
    for (int j = 0; j < 8; ++j) c.all[j][i] = uint8_t(2 * j + i % 2);
    for (int k = 0; k < 4; ++k) c.pair[k][i] = uint8_t(2 * (2 * k + i / 16) + i % 2);
  }
  return c;
}
alignas(32) constexpr LaneControls kLanes = lane_controls();
inline __m256i control(const uint8_t (&c)[32]) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(c)); }

// Q4_K / Q5_K: the 12 bytes of 6-bit scales and mins unpacked in one vector (scales to bytes 0-7,
// mins to 8-15), as scale_min_k4 reads them one at a time: sub-blocks 0-3 keep the low six bits
// of bytes 0-3 (scales) and 4-7 (mins); 4-7 take a nibble of bytes 8-11 under the top two bits of
// bytes 0-3 (scales) or 4-7 (mins)
inline void k4_header(const uint8_t* p, VHeader& h) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));  // 4 bytes into the values
  const __m128i low = _mm_and_si128(_mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1)),
                                    _mm_set1_epi8(63));
  const __m128i n = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 8, 9, 10, 11, -1, -1, -1, -1, 8, 9, 10, 11));
  const __m128i nib = _mm_and_si128(_mm_blend_epi16(n, _mm_srli_epi16(n, 4), 0xC0), _mm_set1_epi8(15));
  const __m128i t = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  const __m128i top = _mm_srli_epi16(_mm_and_si128(t, _mm_set1_epi8(char(0xC0))), 2);
  const __m128i b = _mm_or_si128(low, _mm_or_si128(nib, top));
  h.scales[0] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(b));
  h.mins = _mm_cvtepu8_epi16(_mm_srli_si128(b, 8));
  h.d = half_f16c(p);
  h.dmin = half_f16c(p + 2);
}

inline void vheader(const Q4_0&, const uint8_t* p, VHeader& h) {
  h.d = half_f16c(p);
  h.zero = -8.0f * h.d;
}
inline void vheader(const Q4_1&, const uint8_t* p, VHeader& h) {
  h.d = half_f16c(p);
  h.zero = half_f16c(p + 2);
}
inline void vheader(const Q8_0&, const uint8_t* p, VHeader& h) { h.d = half_f16c(p); }
// eight e8m0 exponent bytes (the low ones of e) -> 2^(e - 128) each: e << 23 is 2^(e - 127) from
// e = 1 on, halved exactly (e = 1 to a subnormal); e = 0's 2^-128 is put in by itself
inline __m256 e8m0_half8(__m128i e) {
  const __m256i e32 = _mm256_cvtepu8_epi32(e);
  const __m256 halved = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(e32, 23)), _mm256_set1_ps(0.5f));
  return _mm256_blendv_ps(halved, _mm256_set1_ps(e8m0_half(0)),
                          _mm256_castsi256_ps(_mm256_cmpeq_epi32(e32, _mm256_setzero_si256())));
}
inline void vheader(const MXFP4&, const uint8_t* p, VHeader& h) {
  h.d = e8m0_half(p[0]);
  h.zero = -12.0f * h.d;
}
inline void vheader(const Q4_K&, const uint8_t* p, VHeader& h) { k4_header(p, h); }
inline void vheader(const Q5_K&, const uint8_t* p, VHeader& h) { k4_header(p, h); }
inline void vheader(const Q6_K&, const uint8_t* p, VHeader& h) {
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
  h.scales[0] = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc));
  h.scales[1] = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(sc, 8)));
  h.d = half_f16c(p + 208);
  h.dmin = 0.f;
}

inline __m256i weights(const Q4_0&, const uint8_t* p, int) { return nibbles32(p + 2); }
inline __m256i weights(const Q4_1&, const uint8_t* p, int) { return nibbles32(p + 4); }
inline __m256i weights(const Q8_0&, const uint8_t* p, int) { return load32(p + 2); }
inline __m256i weights(const MXFP4&, const uint8_t* p, int) {  // codes to their offset integers
  const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Offset)));
  return _mm256_shuffle_epi8(table, nibbles32(p + 1));
}
inline __m256i weights(const Q4_K&, const uint8_t* p, int j) { return k_nibbles(p + 16, j); }
inline __m256i weights(const Q5_K&, const uint8_t* p, int j) {
  const __m256i bit = _mm256_set1_epi8(char(1 << j));
  const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(load32(p + 16), bit), bit),
                                        _mm256_set1_epi8(0x10));
  return _mm256_or_si256(k_nibbles(p + 48, j), high);
}
inline __m256i weights(const Q6_K&, const uint8_t* p, int j) {
  const int half = j / 4, k = j % 4;
  const __m256i lo = load32(p + 64 * half + 32 * (k % 2));
  const __m256i nib = _mm256_and_si256(k < 2 ? lo : _mm256_srli_epi16(lo, 4), _mm256_set1_epi8(0x0F));
  const __m256i pairs = _mm256_and_si256(_mm256_srli_epi16(load32(p + 128 + 32 * half), 2 * k), _mm256_set1_epi8(3));
  return _mm256_or_si256(nib, _mm256_slli_epi16(pairs, 4));
}

// sub-block j's integer dot with its sub-scales applied, in eight int32 lanes
inline __m256i dot(const Q4_0&, __m256i w, __m256i x, const VHeader&, __m256i) { return dot_u8s8(w, x); }
inline __m256i dot(const Q4_1&, __m256i w, __m256i x, const VHeader&, __m256i) { return dot_u8s8(w, x); }
inline __m256i dot(const Q8_0&, __m256i w, __m256i x, const VHeader&, __m256i) {
  // signed weights: |w| times x carrying w's sign
  return dot_u8s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}
inline __m256i dot(const MXFP4&, __m256i w, __m256i x, const VHeader&, __m256i) { return dot_u8s8(w, x); }
// the K-quants' integer dot of sub-block j: u8 weights (Q6_K's u, 32 above its weight: krow takes
// the offset off per super-block, from the halves' sums) times x, each pair times its sub-scale
inline __m256i kdot(__m256i w, __m256i x, __m256i sc) { return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), sc); }

// sub-block j's int16 sub-scales, for dot, from a header's scales (VHeader::scales)
template <class K>
inline __m256i sub_scale(const __m256i* scales, int j) {
  if (std::is_same<K, Q6_K>::value)  // scales 2j (its first 16 weights) and 2j + 1
    return _mm256_shuffle_epi8(scales[j / 4], control(kLanes.pair[j % 4]));
  if (K::SUBS == 8) return _mm256_shuffle_epi8(scales[0], control(kLanes.all[j]));
  return _mm256_setzero_si256();
}

// K-quant super-blocks' terms from their integer dots S and mins terms M (float; Q6_K: 0), dxs =
// d * xs and mxs = dmin * xs: S * dxs - M * mxs, the product rounded, then one fused multiply-add.
// The same operations in any vector width: krow (a super-block a lane), ktile (a token a lane)
template <class V>
inline V k4_terms(V S, V M, V dxs, V mxs);
template <>
inline __m128 k4_terms(__m128 S, __m128 M, __m128 dxs, __m128 mxs) {
  return _mm_fnmadd_ps(M, mxs, _mm_mul_ps(S, dxs));
}
template <>
inline __m256 k4_terms(__m256 S, __m256 M, __m256 dxs, __m256 mxs) {
  return _mm256_fnmadd_ps(M, mxs, _mm256_mul_ps(S, dxs));
}

// Legacy types' blocks' terms from their integer dots S (float), dxs = d * xs, and zero * (the
// block's sum of rounded x): S * dxs + zero * xsum, the product rounded, then one fused multiply-add.
// The same operations in lrow (a block a lane) and ltile (a token a lane).
inline __m256 legacy_terms(__m256 S, __m256 dxs, __m256 zero, __m256 xsum) {
  return _mm256_fmadd_ps(zero, xsum, _mm256_mul_ps(S, dxs));
}
// the eight partial sums of a row's terms (term of block b in sum b % 8), added in one order
inline float legacy_sum(__m256 acc) {
  const __m256 pairs = _mm256_hadd_ps(acc, acc);  // (0 + 1) (2 + 3) .. | (4 + 5) (6 + 7) ..
  const __m256 quads = _mm256_hadd_ps(pairs, pairs);
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(quads), _mm256_extractf128_ps(quads, 1)));
}

// A legacy-type weight row w against NT activation rows from t0: each block's integer dot S,
// reduced for eight blocks at once (a block a lane), then legacy_terms in eight lanes
template <class K, int NT>
inline void lrow(const uint8_t* w, int64_t nb, const Acts& a, int64_t t0, float* out, const char* ahead) {
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    prefetch_span(ahead, b0 * K::BYTES, std::min<int64_t>(nb, b0 + 8) * K::BYTES);
    const int64_t q = std::min<int64_t>(8, nb - b0);
    __m256i pending[NT], pair[NT][4], quad[NT][2];
    // each block's f16 d (and Q4_1's m) put in lanes in registers: a vector load of eight small
    // stores would wait for them (store-to-load forwarding fails across stores)
    __m128i dh = _mm_setzero_si128(), mh = _mm_setzero_si128();  // MXFP4: dh holds exponent bytes
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      __m256i v[NT];
      if (k < q) {
        const uint8_t* p = w + (b0 + k) * K::BYTES;
        uint16_t half;
        std::memcpy(&half, p, 2);
        dh = std::is_same<K, MXFP4>::value ? _mm_insert_epi8(dh, p[0], k) : _mm_insert_epi16(dh, half, k);
        if constexpr (std::is_same<K, Q4_1>::value) {
          std::memcpy(&half, p + 2, 2);
          mh = _mm_insert_epi16(mh, half, k);
        }
        VHeader h;
        const __m256i wv = weights(K{}, p, 0);
        for (int t = 0; t < NT; ++t)
          v[t] = dot(K{}, wv, load32(reinterpret_cast<const uint8_t*>(a.xq + ((t0 + t) * nb + b0 + k) * QBLOCK)), h,
                     _mm256_setzero_si256());
      } else {
        for (int t = 0; t < NT; ++t) v[t] = _mm256_setzero_si256();
      }
      for (int t = 0; t < NT; ++t) {
        if (k % 2 == 0) pending[t] = v[t];
        else pair[t][k / 2] = _mm256_hadd_epi32(pending[t], v[t]);
        if (k == 3 || k == 7) quad[t][k / 4] = _mm256_hadd_epi32(pair[t][k / 4 * 2], pair[t][k / 4 * 2 + 1]);
      }
    }
    const __m256 d8 = std::is_same<K, MXFP4>::value ? e8m0_half8(dh) : _mm256_cvtph_ps(dh);
    const __m256 zero8 = std::is_same<K, Q4_0>::value   ? _mm256_mul_ps(_mm256_set1_ps(-8.0f), d8)
                         : std::is_same<K, MXFP4>::value ? _mm256_mul_ps(_mm256_set1_ps(-12.0f), d8)
                         : std::is_same<K, Q4_1>::value ? _mm256_cvtph_ps(mh)
                                                        : _mm256_setzero_ps();
    const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(q)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int t = 0; t < NT; ++t) {
      // blocks a b c d | e f g h: each block's four lanes, then its other four
      const __m256i S = _mm256_add_epi32(_mm256_permute2x128_si256(quad[t][0], quad[t][1], 0x20),
                                         _mm256_permute2x128_si256(quad[t][0], quad[t][1], 0x31));
      const int64_t at = (t0 + t) * nb + b0;
      const __m256 xs = q == 8 ? _mm256_loadu_ps(a.xscale + at) : _mm256_maskload_ps(a.xscale + at, live);
      const __m256 xsum = q == 8 ? _mm256_loadu_ps(a.xsum + at) : _mm256_maskload_ps(a.xsum + at, live);
      acc[t] = _mm256_add_ps(acc[t], legacy_terms(_mm256_cvtepi32_ps(S), _mm256_mul_ps(d8, xs), zero8, xsum));
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = legacy_sum(acc[t]);
}

// acc + the int16 products of p and s summed by pairs into int32: one dpwssd with VNNI
inline __m256i madd_acc(__m256i acc, __m256i p, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, p, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, p, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
#endif
}

// Two Q4_K / Q5_K super-blocks' 6-bit scales and mins, as k4_header unpacks one, a super-block a
// 128-bit lane: the same operations serve both
inline __m256i k4_header2(const uint8_t* p0, const uint8_t* p1) {
  const __m256i v = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + 4)),
                                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + 4)));
  const auto both = [](__m128i c) { return _mm256_broadcastsi128_si256(c); };
  const __m256i low = _mm256_and_si256(
      _mm256_shuffle_epi8(v, both(_mm_setr_epi8(0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1))),
      _mm256_set1_epi8(63));
  const __m256i n = _mm256_shuffle_epi8(v, both(_mm_setr_epi8(-1, -1, -1, -1, 8, 9, 10, 11, -1, -1, -1, -1, 8, 9, 10, 11)));
  const __m256i nib = _mm256_and_si256(_mm256_blend_epi16(n, _mm256_srli_epi16(n, 4), 0xC0), _mm256_set1_epi8(15));
  const __m256i t = _mm256_shuffle_epi8(v, both(_mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7)));
  const __m256i top = _mm256_srli_epi16(_mm256_and_si256(t, _mm256_set1_epi8(char(0xC0))), 2);
  return _mm256_or_si256(low, _mm256_or_si256(nib, top));
}

// Q super-blocks (1-4) of a K-quant row from super-block s0, against NT activation rows from t0,
// into acc[t] (lane k: super-block s0 + k). Each super-block's integer dot S (sub-scales applied)
// and Q4_K / Q5_K's mins term M (their int8 block sums times the mins) are reduced for the group
// at once, a super-block a lane, before k4_terms' float operations. Q4_K / Q5_K headers are
// unpacked two at a time; the sub-scales are multiplied in with VNNI's dpwssd where the CPU has it
// (one instruction, not madd + add). Against one header at a time, on a Zen 4 EPYC: 1B-
// and 8B-shaped Q4_K 1.2-1.26x at 1-4 tokens from cache, 1.13 / 1.27x at one token from memory;
// Q6_K 1.0-1.17x (bench/gemm.py --rows 1 2 4 --against <the source before> [--from-memory]);
// built for AVX2 alone, a /tmp harness of one Q4_K row gave ~1.15x at one token, parity at four
template <class K, int NT, int Q>
inline void krow_group(const uint8_t* w, int64_t s0, const Acts& a, int64_t t0, __m128* acc) {
  const int64_t cols = a.cols, nb = cols / QBLOCK, nsb = cols / QK;
  const __m256i zero = _mm256_setzero_si256();
  __m256i P[2][NT], first[NT], pair_mins[2] = {zero, zero}, sc2 = zero;
  __m128i halves = _mm_setzero_si128();  // d, dmin of each super-block, put in lanes as lrow does
#pragma GCC unroll 4
  for (int k = 0; k < Q; ++k) {
    const uint8_t* p = w + (s0 + k) * K::BYTES;
    __m256i scales[2];  // int16 sub-scales, broadcast per 128-bit lane
    if constexpr (kmins<K>) {
      if (k % 2 == 0) {
        const __m256i b = k4_header2(p, k + 1 < Q ? p + K::BYTES : p);  // bytes 0-7 scales, 8-15 mins
        sc2 = _mm256_unpacklo_epi8(b, _mm256_setzero_si256());
        const __m256i mins = _mm256_unpackhi_epi8(b, _mm256_setzero_si256());
        pair_mins[k / 2] = k + 1 < Q ? mins : _mm256_zextsi128_si256(_mm256_castsi256_si128(mins));
      }
      scales[0] = _mm256_permute2x128_si256(sc2, sc2, k % 2 == 0 ? 0x00 : 0x11);
      uint32_t both;
      std::memcpy(&both, p, 4);
      halves = _mm_insert_epi32(halves, int(both), k);
    } else {  // Q6_K: sixteen int8 sub-scales, one per 16 weights
      const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
      scales[0] = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc));
      scales[1] = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(sc, 8)));
      uint16_t d;
      std::memcpy(&d, p + 208, 2);
      halves = _mm_insert_epi16(halves, d, 2 * k);
    }
    // one token: sub-blocks in two chains (even, odd), so that VNNI's multiply-accumulate does not
    // wait on itself; more tokens are chains enough (and two each spill AVX2's 16 registers)
    constexpr int CHAINS = NT == 1 ? 2 : 1;
    __m256i isum[CHAINS][NT];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m256i wv = weights(K{}, p, j);
      const __m256i sc = sub_scale<K>(scales, j);
      for (int t = 0; t < NT; ++t) {
        const __m256i x = load32(reinterpret_cast<const uint8_t*>(a.xq256 + (t0 + t) * cols + ((s0 + k) * 8 + j) * QBLOCK));
        const __m256i pr = _mm256_maddubs_epi16(wv, x);
        __m256i& chain = isum[j % CHAINS][t];
        chain = j < CHAINS ? _mm256_madd_epi16(pr, sc) : madd_acc(chain, pr, sc);
      }
    }
    if constexpr (CHAINS == 2)
      for (int t = 0; t < NT; ++t) isum[0][t] = _mm256_add_epi32(isum[0][t], isum[1][t]);
    if constexpr (std::is_same<K, Q6_K>::value) {
      // S took u * x, and u - 32 is the weight: less 32 * sub-scale * (sum of its 16 x), once a
      // super-block (as ktile does) rather than 32 * x a sub-block and weight row
      const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192)));
      for (int t = 0; t < NT; ++t) {
        const __m256i b16 = load32(reinterpret_cast<const uint8_t*>(a.xb16 + (t0 + t) * (cols / 16) + (s0 + k) * 16));
        isum[0][t] = _mm256_sub_epi32(isum[0][t], _mm256_slli_epi32(_mm256_madd_epi16(b16, sc16), 5));
      }
    }
    // per pair of super-blocks (a, b): lanes a01 a23 b01 b23 | a45 a67 b45 b67
    for (int t = 0; t < NT; ++t) {
      if (k % 2 == 0) first[t] = isum[0][t];
      else P[k / 2][t] = _mm256_hadd_epi32(first[t], isum[0][t]);
    }
  }
  for (int t = 0; t < NT; ++t) {  // a group's missing super-blocks: zero
    if (Q % 2 == 1) P[Q / 2][t] = _mm256_hadd_epi32(first[t], zero);
    if (Q < 3) P[1][t] = zero;
  }
  const __m256 dm = _mm256_cvtph_ps(halves);
  const __m128 lo = _mm256_castps256_ps128(dm), hi = _mm256_extractf128_ps(dm, 1);
  const __m128 d4 = _mm_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)), dmin4 = _mm_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));  // Q6_K: 0
  for (int t = 0; t < NT; ++t) {
    const float* xs = a.xscale256 + (t0 + t) * nsb + s0;
    __m128 xs4;
    if constexpr (Q == 4) {
      xs4 = _mm_loadu_ps(xs);
    } else {
      alignas(16) float part[4] = {0.f, 0.f, 0.f, 0.f};
      for (int k = 0; k < Q; ++k) part[k] = xs[k];
      xs4 = _mm_load_ps(part);
    }
    const __m256i ps = _mm256_hadd_epi32(P[0][t], P[1][t]);  // a b c d (four lanes each half)
    const __m128i S = _mm_add_epi32(_mm256_castsi256_si128(ps), _mm256_extracti128_si256(ps, 1));
    __m128i M = _mm_setzero_si128();
    if constexpr (kmins<K>) {
      // the block sums of the super-blocks the group has (mins of the others are zero: none is read)
      const int16_t* bs = a.xbsum256 + (t0 + t) * nb + s0 * 8;
      __m256i Qs[2];
      for (int i = 0; i < 2; ++i) {
        const __m256i b = 2 * i + 1 < Q ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs + 16 * i))
                          : 2 * i < Q ? _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bs + 16 * i)))
                                      : zero;
        Qs[i] = _mm256_madd_epi16(pair_mins[i], b);  // a's four | b's four
      }
      const __m256i qq = _mm256_hadd_epi32(Qs[0], Qs[1]);  // a01 a23 c01 c23 | b01 b23 d01 d23
      const __m256i q2 = _mm256_hadd_epi32(qq, qq);        // a c a c | b d b d
      M = _mm_unpacklo_epi32(_mm256_castsi256_si128(q2), _mm256_extracti128_si256(q2, 1));
    }
    acc[t] = _mm_add_ps(acc[t], k4_terms(_mm_cvtepi32_ps(S), _mm_cvtepi32_ps(M), _mm_mul_ps(d4, xs4), _mm_mul_ps(dmin4, xs4)));
  }
}

// A K-quant weight row w against NT activation rows from t0: groups of four super-blocks, the
// row's last group as long as it is
template <class K, int NT>
inline void krow(const uint8_t* w, int64_t nsb, const Acts& a, int64_t t0, float* out, const char* ahead) {
  __m128 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm_setzero_ps();
  int64_t s0 = 0;
  for (; s0 + 4 <= nsb; s0 += 4) {
    prefetch_span(ahead, s0 * K::BYTES, (s0 + 4) * K::BYTES);
    krow_group<K, NT, 4>(w, s0, a, t0, acc);
  }
  if (s0 < nsb) {
    prefetch_span(ahead, s0 * K::BYTES, nsb * K::BYTES);
    if (nsb - s0 == 1) krow_group<K, NT, 1>(w, s0, a, t0, acc);
    else if (nsb - s0 == 2) krow_group<K, NT, 2>(w, s0, a, t0, acc);
    else krow_group<K, NT, 3>(w, s0, a, t0, acc);
  }
  for (int t = 0; t < NT; ++t) {
    const __m128 pairs = _mm_hadd_ps(acc[t], acc[t]);  // (0 + 1), (2 + 3)
    out[t] = _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
  }
}

// Weight bytes 4C..4C+3 of a block in every lane (lo, hi: the block's first and last 16 bytes in
// both 128-bit lanes)
template <int C>
inline __m256i chunk_of(__m256i lo, __m256i hi) {
  return _mm256_shuffle_epi32(C < 4 ? lo : hi, (C % 4) * 0x55);
}
// Chunk C of a legacy block against G interleaved groups: Q4_0 / Q4_1's u8 x s8 pairs add up in
// int16 over the block's eight chunks (16 products of 15 * 127) before one multiply-add, MXFP4's
// (of 24 * 127) over four; Q8_0's signed weights take their sign over to x, and each chunk its
// multiply-add. With VNNI: one dpbusd a chunk (Q8_0's sign moved first), the same integers, in two
// chains a group (even and odd chunks: one chain waited on each dpbusd's latency; Q8_0 1.04-1.09x
// against one chain, bench/gemm.py --against)
template <class K, int G, int C>
inline void lchunks(__m256i lo, __m256i hi, const int8_t* const* xb, __m256i* s16, __m256i* S) {
#if RS_VNNI
  if constexpr (C < 8) {
    const __m256i wc = chunk_of<C>(lo, hi);
    const __m256i u = std::is_same<K, Q8_0>::value ? _mm256_sign_epi8(wc, wc) : wc;
    for (int i = 0; i < G; ++i) {
      __m256i x = load32(reinterpret_cast<const uint8_t*>(xb[i] + 32 * C));
      if constexpr (std::is_same<K, Q8_0>::value) x = _mm256_sign_epi8(x, wc);
      s16[2 * i + C % 2] = dpbusd(C < 2 ? _mm256_setzero_si256() : s16[2 * i + C % 2], u, x);
      if (C == 7) S[i] = _mm256_add_epi32(s16[2 * i], s16[2 * i + 1]);
    }
    lchunks<K, G, C + 1>(lo, hi, xb, s16, S);
  }
#else
  if constexpr (C < 8) {
    constexpr int CH = std::is_same<K, MXFP4>::value ? 4 : 8;  // chunks a block's int16 sums hold
    const __m256i wc = chunk_of<C>(lo, hi), ones = _mm256_set1_epi16(1);
    for (int i = 0; i < G; ++i) {
      const __m256i x = load32(reinterpret_cast<const uint8_t*>(xb[i] + 32 * C));
      if constexpr (std::is_same<K, Q8_0>::value) {
        const __m256i prod = _mm256_maddubs_epi16(_mm256_sign_epi8(wc, wc), _mm256_sign_epi8(x, wc));
        S[i] = C == 0 ? _mm256_madd_epi16(prod, ones) : _mm256_add_epi32(S[i], _mm256_madd_epi16(prod, ones));
      } else {
        const __m256i prod = _mm256_maddubs_epi16(wc, x);
        s16[i] = C % CH == 0 ? prod : _mm256_add_epi16(s16[i], prod);
        if (C % CH == CH - 1) {
          const __m256i part = _mm256_madd_epi16(s16[i], ones);
          S[i] = C == CH - 1 ? part : _mm256_add_epi32(S[i], part);
        }
      }
    }
    lchunks<K, G, C + 1>(lo, hi, xb, s16, S);
  }
#endif
}

// A legacy-type weight row (w: its first block) against interleaved groups g .. g + G - 1 of xq
// (interleave_team): lane t of y[i] is what lrow gives for activation row 8(g + i) + t, bit for
// bit (the same integer S a block, the same legacy_terms, the same eight partial sums in order)
template <class K, int G>
inline void ltile(const uint8_t* w, int64_t nb, const Acts& a, int64_t g, __m256* y) {
  __m256 acc[G][8];
  for (int i = 0; i < G; ++i)
    for (int k = 0; k < 8; ++k) acc[i][k] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = w + b * K::BYTES;
    VHeader h;
    vheader(K{}, p, h);
    const __m256i wv = weights(K{}, p, 0);
    const int8_t* xb[G];
    for (int i = 0; i < G; ++i) xb[i] = a.xi + ((g + i) * nb + b) * 256;
    __m256i s16[2 * G], S[G];
    lchunks<K, G, 0>(_mm256_permute2x128_si256(wv, wv, 0x00), _mm256_permute2x128_si256(wv, wv, 0x11), xb, s16, S);
    const float zero = K::ZERO ? h.zero : 0.f;
    for (int i = 0; i < G; ++i) {
      const int64_t at = ((g + i) * nb + b) * 8;
      acc[i][b % 8] = _mm256_add_ps(acc[i][b % 8],
                                    legacy_terms(_mm256_cvtepi32_ps(S[i]), _mm256_mul_ps(_mm256_set1_ps(h.d), _mm256_loadu_ps(a.xi_scale + at)),
                                                 _mm256_set1_ps(zero), _mm256_loadu_ps(a.xi_sum + at)));
    }
  }
  for (int i = 0; i < G; ++i)  // legacy_sum's order, lane by lane
    y[i] = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[i][0], acc[i][1]), _mm256_add_ps(acc[i][2], acc[i][3])),
                         _mm256_add_ps(_mm256_add_ps(acc[i][4], acc[i][5]), _mm256_add_ps(acc[i][6], acc[i][7])));
}

// Chunk C of sub-block j against G interleaved groups: the u8 x s8 pairs add up in int16 over
// CH chunks (Q4_K's 16 products of 15 * 127 stay under 2^15; Q5_K's 31 allow 8, Q6_K's 63 four),
// then take their sub-scale (chunks 0-3: lo, 4-7: hi) in one multiply-add: 1 + 1 / CH multiplies
// per 32 products and 8 tokens, where krow spends two (Q6_K three)
// With VNNI the chunks add up in int32 (dpbusd) over the sub-block (Q6_K: each half of it), then
// take the sub-scale in one int32 multiply: the same integers, with half the instructions
template <class K, int G, int C>
inline void kchunks(__m256i lo, __m256i hi, const int8_t* const* xb, __m256i sc_lo, __m256i sc_hi, __m256i* s16,
                    __m256i* S) {
#if RS_VNNI
  if constexpr (C < 8) {
    constexpr int CH = std::is_same<K, Q6_K>::value ? 4 : 8;
    const __m256i wc = chunk_of<C>(lo, hi);
    for (int i = 0; i < G; ++i) {
      s16[i] = dpbusd(C % CH == 0 ? _mm256_setzero_si256() : s16[i], wc,
                      load32(reinterpret_cast<const uint8_t*>(xb[i] + 32 * C)));
      if (C % CH == CH - 1)  // the int16 sub-scale pairs' high halves, as int32
        S[i] = _mm256_add_epi32(S[i], _mm256_mullo_epi32(s16[i], _mm256_srai_epi32(C < 4 ? sc_lo : sc_hi, 16)));
    }
    kchunks<K, G, C + 1>(lo, hi, xb, sc_lo, sc_hi, s16, S);
  }
#else
  if constexpr (C < 8) {
    constexpr int CH = std::is_same<K, Q4_K>::value ? 8 : std::is_same<K, Q5_K>::value ? 4 : 2;
    const __m256i wc = chunk_of<C>(lo, hi);
    for (int i = 0; i < G; ++i) {
      const __m256i prod = _mm256_maddubs_epi16(wc, load32(reinterpret_cast<const uint8_t*>(xb[i] + 32 * C)));
      s16[i] = C % CH == 0 ? prod : _mm256_add_epi16(s16[i], prod);
      if (C % CH == CH - 1) S[i] = _mm256_add_epi32(S[i], _mm256_madd_epi16(s16[i], C < 4 ? sc_lo : sc_hi));
    }
    kchunks<K, G, C + 1>(lo, hi, xb, sc_lo, sc_hi, s16, S);
  }
#endif
}

// int16 pairs (lane 2t, 2t + 1) of eight rows against one pair of int16 factors, summed per row
inline __m256i pair_dot(const int16_t* pairs, __m256i factors) {
  return _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs)), factors);
}

// A K-quant weight row (w: its first super-block) against interleaved groups g .. g + G - 1 of
// xq256 (interleave_k_team): lane t of y[i] is what krow gives for activation row 8(g + i) + t,
// bit for bit (the same integers S and M a super-block, the same k4_terms, the same four partial
// sums added in the same order)
template <class K, int G>
inline void ktile(const uint8_t* w, int64_t nsb, const Acts& a, int64_t g, __m256* y) {
  const int64_t nb = a.cols / QBLOCK;
  __m256 acc[G][4];
  for (int i = 0; i < G; ++i)
    for (int k = 0; k < 4; ++k) acc[i][k] = _mm256_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* p = w + s * K::BYTES;
    VHeader h;
    vheader(K{}, p, h);
    __m256i S[G], s16[G];
    for (int i = 0; i < G; ++i) S[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m256i wv = weights(K{}, p, j);
      const int8_t* xb[G];
      for (int i = 0; i < G; ++i) xb[i] = a.xk + ((g + i) * nb + s * 8 + j) * 256;
      __m256i sc_lo = sub_scale<K>(h.scales, j), sc_hi = sc_lo;
      if constexpr (std::is_same<K, Q6_K>::value) {  // sub-scales 2j (weights 0-15), 2j + 1
        sc_lo = _mm256_shuffle_epi8(h.scales[j / 4], control(kLanes.all[2 * j % 8]));
        sc_hi = _mm256_shuffle_epi8(h.scales[j / 4], control(kLanes.all[(2 * j + 1) % 8]));
      }
      kchunks<K, G, 0>(_mm256_permute2x128_si256(wv, wv, 0x00), _mm256_permute2x128_si256(wv, wv, 0x11), xb,
                       sc_lo, sc_hi, s16, S);
    }
    for (int i = 0; i < G; ++i) {
      const int64_t at = (g + i) * nsb + s;
      __m256i M = _mm256_setzero_si256();
      if constexpr (kmins<K>) {  // mins 2p, 2p + 1 against each row's block sums 2p, 2p + 1
        const __m256i mins = _mm256_broadcastsi128_si256(h.mins);
        const int16_t* bs = a.xk_bsum + at * 64;
        M = _mm256_add_epi32(_mm256_add_epi32(pair_dot(bs, _mm256_shuffle_epi32(mins, 0x00)),
                                              pair_dot(bs + 16, _mm256_shuffle_epi32(mins, 0x55))),
                             _mm256_add_epi32(pair_dot(bs + 32, _mm256_shuffle_epi32(mins, 0xAA)),
                                              pair_dot(bs + 48, _mm256_shuffle_epi32(mins, 0xFF))));
      } else {  // Q6_K: S took u * x, and u - 32 is the weight: less 32 * sub-scale * (sum of its 16 x)
        const int16_t* b16 = a.xk_b16 + at * 128;
        __m256i off = _mm256_setzero_si256();
        for (int q = 0; q < 8; ++q)
          off = _mm256_add_epi32(off, pair_dot(b16 + 16 * q, _mm256_shuffle_epi32(h.scales[q / 4], 0x55 * (q % 4))));
        S[i] = _mm256_sub_epi32(S[i], _mm256_slli_epi32(off, 5));
      }
      const __m256 xs = _mm256_loadu_ps(a.xk_scale + at * 8);
      acc[i][s % 4] = _mm256_add_ps(acc[i][s % 4], k4_terms(_mm256_cvtepi32_ps(S[i]), _mm256_cvtepi32_ps(M),
                                                            _mm256_mul_ps(_mm256_set1_ps(h.d), xs),
                                                            _mm256_mul_ps(_mm256_set1_ps(h.dmin), xs)));
    }
  }
  for (int i = 0; i < G; ++i)
    y[i] = _mm256_add_ps(_mm256_add_ps(acc[i][0], acc[i][1]), _mm256_add_ps(acc[i][2], acc[i][3]));
}

// Eight floats to bf16 as from_f<bf16> rounds them (to nearest even; a NaN stays a NaN)
inline __m128i bf16_8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v), high = _mm256_srli_epi32(u, 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i even = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
  const __m256i r = _mm256_blendv_epi8(_mm256_srli_epi32(_mm256_add_epi32(u, even), 16),
                                       _mm256_or_si256(high, _mm256_set1_epi32(0x40)), nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// A block's weights as bf16: K::dequantize's operations, in its order, on eight lanes at a time,
// the same bits (the compiler vectorised the scalar loops of the simpler types, not Q6_K's or
// MXFP4's, whose panels then paid only from ~256 rows: bench/gemm.py --rows 64 128 192 256)
template <class K>
inline void dequantize_bf16(const uint8_t* p, bf16* o) {
  Header<K::SUBS> h;
  K::header(p, h);
  for (int j = 0; j < K::SUBS; ++j) {
    const __m256i w = weights(K{}, p, j);
    for (int c = 0; c < 4; ++c) {
      const __m128i half = c < 2 ? _mm256_castsi256_si128(w) : _mm256_extracti128_si256(w, 1);
      const __m128i bytes = c % 2 == 0 ? half : _mm_srli_si128(half, 8);
      const __m256i q = std::is_same<K, Q8_0>::value ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
      const auto f = [](__m256i i) { return _mm256_cvtepi32_ps(i); };
      __m256 y;
      if constexpr (std::is_same<K, Q4_0>::value) y = _mm256_mul_ps(_mm256_set1_ps(h.scale[0]), f(_mm256_sub_epi32(q, _mm256_set1_epi32(8))));
      else if constexpr (std::is_same<K, MXFP4>::value)  // weights() gives kMxfp4[code] + 12
        y = _mm256_mul_ps(_mm256_set1_ps(h.scale[0]), f(_mm256_sub_epi32(q, _mm256_set1_epi32(12))));
      else if constexpr (std::is_same<K, Q8_0>::value) y = _mm256_mul_ps(_mm256_set1_ps(h.scale[0]), f(q));
      else if constexpr (std::is_same<K, Q6_K>::value) {   // sub-scale 2k of the half for weights 0-15, 2k + 1 after
        const float sc = h.d * float(int8_t(p[192 + 8 * (j / 4) + 2 * (j % 4) + c / 2]));
        y = _mm256_mul_ps(_mm256_set1_ps(sc), f(_mm256_sub_epi32(q, _mm256_set1_epi32(32))));
      } else {  // Q4_1: d * q + m; Q4_K / Q5_K: (d * sc) * q - dmin * m
        y = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(h.scale[j]), f(q)), _mm256_set1_ps(h.zero[j]));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32 * j + 8 * c), bf16_8(y));
    }
  }
}
#else
// the portable form of krow / lrow: weight row w against NT activation rows from t0
template <class K, int NT>
inline void tile(const uint8_t* w, int64_t nsb, const Acts& a, int64_t t0, float* out) {
  const int64_t cols = a.cols, nb = cols / QBLOCK;
  for (int t = 0; t < NT; ++t) {
    float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};  // as lrow / krow sum them
    const int64_t row = t0 + t;
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* p = w + s * K::BYTES;
      Header<K::SUBS> h;
      K::header(p, h);
      int32_t ksum = 0, msum = 0;
      for (int j = 0; j < K::SUBS; ++j) {
        const int64_t b = s * K::SUBS + j;
        const int8_t* x = (K::SUBS == 1 ? a.xq : a.xq256) + row * cols + b * QBLOCK;
        int32_t d = 0;
        for (int l = 0; l < QBLOCK; ++l) d += K::q(p, j, l) * x[l];
        if (K::SUBS == 1) {
          const float zero = K::ZERO ? h.zero[0] : 0.f;
          part[b % 8] += std::fma(zero, a.xsum[row * nb + b], float(d) * (h.scale[0] * a.xscale[row * nb + b]));
        } else {
          ksum += h.isc[j] * d;
        }
        if (kmins<K>) msum += h.imin[j] * a.xbsum256[row * nb + b];
      }
      const float xs = K::SUBS > 1 ? a.xscale256[row * nsb + s] : 0.f;
      if (K::SUBS > 1) part[s % 4] += std::fma(-float(msum), h.dmin * xs, float(ksum) * (h.d * xs));
    }
    out[t] = K::SUBS > 1 ? (part[0] + part[1]) + (part[2] + part[3])
                         : ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  }
}
#endif

// A block of 32 activations: its largest magnitude
inline float block_top(const float* xb) {
#if defined(__AVX2__) && defined(__FMA__)
  __m256 top8 = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int i = 0; i < 4; ++i) top8 = _mm256_max_ps(top8, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * i)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(top8), _mm256_extractf128_ps(top8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return std::max(_mm_cvtss_f32(m4), _mm_cvtss_f32(_mm_movehdup_ps(m4)));
#else
  float top = 0.f;
  for (int j = 0; j < QBLOCK; ++j) top = std::max(top, std::fabs(xb[j]));
  return top;
#endif
}

// qb = x * inv rounded to nearest even (the default mode, as nearbyint rounds), |x * inv| <= 127
inline void round_block(const float* xb, float inv, int8_t* qb) {
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 iv = _mm256_set1_ps(inv);
  const auto q = [&](int i) { return _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * i), iv)); };
  // the packs' lanes put back in order
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q(0), q(1)), _mm256_packs_epi32(q(2), q(3)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb),
                      _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#else
  for (int j = 0; j < QBLOCK; ++j) qb[j] = int8_t(std::nearbyint(xb[j] * inv));
#endif
}

// the sums of the two halves of a block of 32 int8 (each at most 16 * 127 in magnitude)
inline void block_isums(const int8_t* qb, int16_t* halves) {
#if defined(__AVX2__) && defined(__FMA__)
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb)));
  const __m256i quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));  // bytes 0-15 low, 16-31 high
  const __m256i q2 = _mm256_add_epi32(quads, _mm256_shuffle_epi32(quads, 0x4E));
  const __m256i q1 = _mm256_add_epi32(q2, _mm256_shuffle_epi32(q2, 0xB1));
  halves[0] = int16_t(_mm256_cvtsi256_si32(q1));
  halves[1] = int16_t(_mm_cvtsi128_si32(_mm256_extracti128_si256(q1, 1)));
#else
  for (int h = 0; h < 2; ++h) {
    int32_t total = 0;
    for (int j = 0; j < QBLOCK / 2; ++j) total += qb[16 * h + j];
    halves[h] = int16_t(total);
  }
#endif
}

// 256 values (a K-quant super-block's span) to int8 under their largest magnitude `top`, and the
// sums of each block's halves (halves[2b], halves[2b + 1])
inline void round_group(const float* x, float top, int8_t* q, int16_t* halves) {
  for (int64_t b = 0; b < QK / QBLOCK; ++b) {
    round_block(x + b * QBLOCK, top > 0.f ? 127.0f / top : 0.f, q + b * QBLOCK);
    block_isums(q + b * QBLOCK, halves + 2 * b);
  }
}

// Block types, as runtime/models/quant.py numbers them
enum BlockKind : int64_t {
  KIND_Q4_0 = 0, KIND_Q4_1 = 1, KIND_Q8_0 = 2, KIND_Q4_K = 3, KIND_Q5_K = 4, KIND_Q6_K = 5, KIND_MXFP4 = 6
};
inline bool legacy_kind(int64_t kind) { return kind <= KIND_Q8_0 || kind == KIND_MXFP4; }

template <class F>
inline void with_kind(int64_t kind, F f) {
  switch (kind) {
    case KIND_Q4_0: f(Q4_0{}); break;
    case KIND_Q4_1: f(Q4_1{}); break;
    case KIND_Q8_0: f(Q8_0{}); break;
    case KIND_Q4_K: f(Q4_K{}); break;
    case KIND_Q5_K: f(Q5_K{}); break;
    case KIND_MXFP4: f(MXFP4{}); break;
    default: f(Q6_K{}); break;
  }
}

// Rows of one block type: output row i is the file's row row_map[i] (row_map null: row i), each
// row_bytes apart; where the map is a permutation, out_of is its inverse (the output row of each
// file row), and the kernels walk the file's rows in order (`pass_row`). A matrix is up to three
// of these stacked along the output dim (q, k and v as one projection: their types may differ,
// Q4_K_M gives v more bits) and a float32 bias.
struct BlockSegment {
  const uint8_t* data;
  const int32_t* row_map;
  const int32_t* out_of;
  int64_t row_bytes, rows, kind;
};
// Step i of a pass over a segment's rows: the weight row it reads and the output row it writes
inline const uint8_t* pass_weights(const BlockSegment& s, int64_t i) {
  return s.data + (s.out_of != nullptr || s.row_map == nullptr ? i : s.row_map[i]) * s.row_bytes;
}
inline int64_t pass_row(const BlockSegment& s, int64_t i) { return s.out_of != nullptr ? s.out_of[i] : i; }
struct BlockMatrix {
  BlockSegment segment[3];
  int64_t n_segments;
  const float* bias;
  int64_t rows, cols;
};

// Activation rows a prefill pass holds in L2 while every weight row streams past (bytes)
constexpr int64_t CHUNK_BYTES = 128 << 10;
// From this many activation rows, a legacy-type matrix runs on rows interleaved by eight (ltile):
// about half the instructions of one row by four tokens (lrow) per multiply, padding rows included
// (bench/gemm.py --interleave)
#ifndef RS_INTERLEAVE_ROWS
#define RS_INTERLEAVE_ROWS 5
#endif
constexpr int64_t INTERLEAVE_ROWS = RS_INTERLEAVE_ROWS;
// From this many, K-quant matrices run on rows interleaved by eight too (ktile): 1.5-2x the one
// row by four tiles at 5 to 64 rows (bench/gemm.py --kinterleave)
#ifndef RS_KINTERLEAVE_ROWS
#define RS_KINTERLEAVE_ROWS 5
#endif
constexpr int64_t KINTERLEAVE_ROWS = RS_KINTERLEAVE_ROWS;

// step i of a pass: its weight row against NT tokens from t0, into its output row
template <class K, int NT>
inline void run_tile(const BlockSegment& s, int64_t i, int64_t t0, int64_t n, int64_t row0, int64_t out_rows,
                     const Acts& a, const float* bias, float* out, bool prefetch) {
  const int64_t nsb = a.cols / (QBLOCK * K::SUBS), r = pass_row(s, i);
  const uint8_t* w = pass_weights(s, i);
  const char* ahead = prefetch && i + PREFETCH_ROWS < s.rows
                          ? reinterpret_cast<const char*>(pass_weights(s, i + PREFETCH_ROWS)) : nullptr;
  if (ahead != nullptr && s.row_bytes <= PREFETCH_BURST_BYTES) {  // at once: a short burst, more lead
    for (int64_t o = 0; o < s.row_bytes; o += 64) __builtin_prefetch(ahead + o, 0, 3);
    ahead = nullptr;
  }
  float d[NT];
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (K::SUBS == 8) krow<K, NT>(w, nsb, a, t0, d, ahead);
  else lrow<K, NT>(w, nsb, a, t0, d, ahead);
#else
  tile<K, NT>(w, nsb, a, t0, d);
#endif
  for (int t = 0; t < NT && t0 + t < n; ++t) {
    float y = d[t];
    if (bias != nullptr) y += bias[row0 + r];  // after the sum, as a separate bias add rounds
    out[(t0 + t) * out_rows + row0 + r] = y;
  }
}

// NT tokens against every weight row of a segment, a row a tile (orphaned loops, as below)
template <class K, int NT>
inline void rows_once(const BlockMatrix& m, const BlockSegment& s, int64_t row0, const Acts& a, float* out) {
#pragma omp for schedule(static) nowait
  for (int64_t i = 0; i < s.rows; ++i) run_tile<K, NT>(s, i, 0, NT, row0, m.rows, a, m.bias, out, true);
}

#if defined(__AVX2__) && defined(__FMA__)
template <class K, int G>
inline void xtile(const uint8_t* w, int64_t blocks, const Acts& a, int64_t g, __m256* y) {
  if constexpr (K::SUBS == 8) ktile<K, G>(w, blocks, a, g, y);
  else ltile<K, G>(w, blocks, a, g, y);
}
#endif

// One segment's rows of out [n, m.rows]. Called by every thread of a team (orphaned worksharing
// loops, nowait: the caller ends the matrix with a barrier). The activations are padded to a
// multiple of four rows (QuantizedRows), so that a tile's four always exist; only n are written.
template <class K>
void segment_team(const BlockMatrix& m, const BlockSegment& s, int64_t row0, int64_t n, const Acts& a, float* out) {
  const int64_t cols = m.cols;
  // one or two tokens (one or two requests decoding): every weight row read once, two at a time,
  // in tiles as wide as the tokens (not four with padding)
  if (n == 1) return rows_once<K, 1>(m, s, row0, a, out);
  if (n == 2) return rows_once<K, 2>(m, s, row0, a, out);
#if defined(__AVX2__) && defined(__FMA__)
  if (n >= (K::SUBS == 8 ? KINTERLEAVE_ROWS : INTERLEAVE_ROWS)) {
    // groups of eight interleaved rows (interleave_team / interleave_k_team made them) that stay in
    // L2, each against every weight row, two groups a weight row's pass
    const int64_t blocks = cols / (QBLOCK * K::SUBS), groups = (n + 7) / 8;
    const int64_t chunk = std::max<int64_t>(2, CHUNK_BYTES / (8 * cols) / 2 * 2);
    for (int64_t g0 = 0; g0 < groups; g0 += chunk) {
      const int64_t g1 = std::min(groups, g0 + chunk);
#pragma omp for schedule(static) nowait
      for (int64_t i = 0; i < s.rows; ++i)
        for (int64_t g = g0, r = pass_row(s, i); g < g1; g += 2) {
          __m256 y[2];
          if (g + 1 < g1) xtile<K, 2>(pass_weights(s, i), blocks, a, g, y);
          else xtile<K, 1>(pass_weights(s, i), blocks, a, g, y);
          const float bias = m.bias != nullptr ? m.bias[row0 + r] : 0.f;
          for (int64_t gi = 0; gi < 2 && g + gi < g1; ++gi) {
            alignas(32) float v[8];
            _mm256_store_ps(v, y[gi]);
            for (int64_t t = 0; t < 8 && 8 * (g + gi) + t < n; ++t)
              out[(8 * (g + gi) + t) * m.rows + row0 + r] = m.bias != nullptr ? v[t] + bias : v[t];
          }
        }
    }
    return;
  }
#endif
  // chunks of activation rows that stay in L2, each against every weight row, one row by four
  // tokens a tile (each unpacked block used four times)
  const int64_t chunk = std::max<int64_t>(4, CHUNK_BYTES / cols / 4 * 4);
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t c1 = std::min(n, c0 + chunk);
#pragma omp for schedule(static) nowait
    for (int64_t i = 0; i < s.rows; ++i)
      for (int64_t t0 = c0; t0 < c1; t0 += 4) run_tile<K, 4>(s, i, t0, n, row0, m.rows, a, m.bias, out, n < 8);
  }
}

// Acts' interleaved groups of rows 0..n-1 (the rows past n up to a multiple of eight as zeros).
// Called by every thread of a team; ends in a barrier.
// a block of 32 int8 of row t of a group (src; null: a padding row, zeros) into the group's block
// dst, chunk c (values 4c..4c+3) at bytes 32c + 4t
inline void interleave_block(const int8_t* src, int64_t t, int8_t* dst) {
  for (int c = 0; c < 8; ++c) {
    if (src != nullptr) std::memcpy(dst + 32 * c + 4 * t, src + 4 * c, 4);
    else std::memset(dst + 32 * c + 4 * t, 0, 4);
  }
}

inline void interleave_team(const Acts& a, int64_t n) {
  const int64_t nb = a.cols / QBLOCK, groups = (n + 7) / 8;
#pragma omp for schedule(static)
  for (int64_t gb = 0; gb < groups * nb; ++gb) {
    const int64_t g = gb / nb, b = gb % nb;
    int8_t* dst = a.xi + gb * 256;
    for (int64_t t = 0; t < 8; ++t) {
      const int64_t r = 8 * g + t;
      interleave_block(r < n ? a.xq + r * a.cols + b * QBLOCK : nullptr, t, dst);
      if (r < n) {
        a.xi_scale[gb * 8 + t] = a.xscale[r * nb + b];
        a.xi_sum[gb * 8 + t] = a.xsum[r * nb + b];
      } else {
        a.xi_scale[gb * 8 + t] = 0.f;
        a.xi_sum[gb * 8 + t] = 0.f;
      }
    }
  }
}

// The same of xq256 for the K-quants (ktile), with the rows' super-block scales and block sums
inline void interleave_k_team(const Acts& a, int64_t n) {
  const int64_t nb = a.cols / QBLOCK, nsb = a.cols / QK, groups = (n + 7) / 8;
#pragma omp for schedule(static)
  for (int64_t gb = 0; gb < groups * nb; ++gb) {
    const int64_t g = gb / nb, b = gb % nb, s = b / 8, j = b % 8;
    int8_t* dst = a.xk + gb * 256;
    int16_t* bsum = a.xk_bsum + ((g * nsb + s) * 4 + j / 2) * 16 + j % 2;
    int16_t* b16 = a.xk_b16 + ((g * nsb + s) * 8 + j) * 16;
    float* scale = a.xk_scale + (g * nsb + s) * 8;
    for (int64_t t = 0; t < 8; ++t) {
      const int64_t r = 8 * g + t;
      interleave_block(r < n ? a.xq256 + r * a.cols + b * QBLOCK : nullptr, t, dst);
      if (r < n) {
        bsum[2 * t] = a.xbsum256[r * nb + b];
        std::memcpy(b16 + 2 * t, a.xb16 + 2 * (r * nb + b), 4);
        if (j == 0) scale[t] = a.xscale256[r * nsb + s];
      } else {
        bsum[2 * t] = 0;
        b16[2 * t] = b16[2 * t + 1] = 0;
        if (j == 0) scale[t] = 0.f;
      }
    }
  }
}

// out [n, rows] = x [n, cols] times the weight^T (+ bias), from x as QuantizedRows leaves it.
// Called by every thread of a team; ends in a barrier.
inline void matmul_team(const BlockMatrix& m, int64_t n, const Acts& a, float* out) {
#if defined(__AVX2__) && defined(__FMA__)
  const auto any = [&](auto kinds) { return std::any_of(m.segment, m.segment + m.n_segments, kinds); };
  if (n >= INTERLEAVE_ROWS && any([](const BlockSegment& s) { return legacy_kind(s.kind); })) interleave_team(a, n);
  if (n >= KINTERLEAVE_ROWS && any([](const BlockSegment& s) { return !legacy_kind(s.kind); }))
    interleave_k_team(a, n);
#endif
  int64_t row0 = 0;
  for (int64_t i = 0; i < m.n_segments; ++i) {
    const BlockSegment& s = m.segment[i];
    with_kind(s.kind, [&](auto k) { segment_team<decltype(k)>(m, s, row0, n, a, out); });
    row0 += s.rows;
  }
#pragma omp barrier
}

// Activation scratch of n rows of up to `cols` values in both of Acts' forms. Rows n.. up to a
// multiple of four exist but hold anything: segment_team's tiles read them, and their sums, kept
// apart from the real rows', are never written.
struct QuantizedRows {
  int8_t* xq;
  int8_t* xq256;
  float* xscale;
  float* xsum;
  float* xscale256;
  int8_t* xi;
  float* xi_scale;
  float* xi_sum;
  int16_t* xbsum256;
  int16_t* xb16;
  int8_t* xk;
  float* xk_scale;
  int16_t* xk_bsum;
  int16_t* xk_b16;
  QuantizedRows(int64_t n, int64_t cols) {
    const int64_t nb = cols / QBLOCK, n4 = (n + 3) / 4 * 4, bytes = (n4 * cols + 63) / 64 * 64;
    const int64_t n8 = (n + 7) / 8 * 8, ibytes = n8 * cols;
    xq = static_cast<int8_t*>(std::malloc(2 * bytes + 2 * ibytes +
                                          sizeof(float) * (2 * n4 * nb + n4 * (nb / 8 + 1) + 2 * n8 * nb + n8 * (nb / 8 + 1)) +
                                          sizeof(int16_t) * 3 * (n4 * nb + n8 * nb)));
    xq256 = xq + bytes;
    xi = xq256 + bytes;
    xk = xi + ibytes;
    xscale = reinterpret_cast<float*>(xk + ibytes);
    xsum = xscale + n4 * nb;
    xscale256 = xsum + n4 * nb;
    xi_scale = xscale256 + n4 * (nb / 8 + 1);
    xi_sum = xi_scale + n8 * nb;
    xk_scale = xi_sum + n8 * nb;
    xbsum256 = reinterpret_cast<int16_t*>(xk_scale + n8 * (nb / 8 + 1));
    xb16 = xbsum256 + n4 * nb;
    xk_bsum = xb16 + 2 * n4 * nb;
    xk_b16 = xk_bsum + n8 * nb;
  }
  ~QuantizedRows() { std::free(xq); }
  QuantizedRows(const QuantizedRows&) = delete;
  QuantizedRows& operator=(const QuantizedRows&) = delete;

  // the layout of rows `cols` wide
  Acts view(int64_t cols) const {
    return Acts{xq, xscale, xsum, xq256, xscale256, xbsum256, xb16, cols, xi, xi_scale, xi_sum, xk, xk_scale, xk_bsum, xk_b16};
  }

  // values [c0, c0 + len) of row r (x: the row, cols wide), len a multiple of 32; the super-block
  // form too where cols is a multiple of 256 (then c0 and len are too)
  void quantize(const float* x, int64_t r, int64_t c0, int64_t len, int64_t cols) {
    const int64_t nb = cols / QBLOCK;
    float top[QK / QBLOCK];
    for (int64_t c = c0; c < c0 + len; c += QBLOCK) {
      const int64_t b = r * nb + c / QBLOCK;
      const float t = block_top(x + c);
      round_block(x + c, t > 0.f ? 127.0f / t : 0.f, xq + r * cols + c);
      xscale[b] = t / 127.0f;
      // the rounded block's sum (llama.cpp's q8_1 keeps the same): a zero term then meets the
      // activations the integer dot met, so a weight read as code + offset under a zero is exactly
      // its signed form (MXFP4's code + 12 would else be twice as far off)
      int16_t halves[2];
      block_isums(xq + r * cols + c, halves);
      xsum[b] = xscale[b] * float(halves[0] + halves[1]);
      top[(c / QBLOCK) % (QK / QBLOCK)] = t;
      if (cols % QK == 0 && (c + QBLOCK) % QK == 0) {
        const int64_t g = c + QBLOCK - QK;
        const float t256 = *std::max_element(top, top + QK / QBLOCK);
        round_group(x + g, t256, xq256 + r * cols + g, xb16 + 2 * (r * nb + g / QBLOCK));
        for (int64_t b = 0; b < QK / QBLOCK; ++b) {
          const int16_t* halves = xb16 + 2 * (r * nb + g / QBLOCK + b);
          xbsum256[r * nb + g / QBLOCK + b] = int16_t(halves[0] + halves[1]);
        }
        xscale256[r * (cols / QK) + c / QK] = t256 / 127.0f;
      }
    }
  }
};

// out [n, rows] = x [n, cols] (float32, contiguous) times the block-quantized weight^T (+ bias)
void block_linear(const BlockMatrix& m, const float* x, int64_t n, float* out) {
  if (n == 0) return;
  QuantizedRows a(n, m.cols);
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) a.quantize(x + t * m.cols, t, 0, m.cols, m.cols);
    matmul_team(m, n, a.view(m.cols), out);
  }
}

// Rows `ids` of a block-quantized segment as float32 [n, cols] (an embedding lookup), exactly as
// the gguf package dequantises them
void dequantize_rows(const BlockSegment& s, int64_t cols, const int64_t* ids, int64_t n, float* out) {
  with_kind(s.kind, [&](auto k) {
    using K = decltype(k);
    const int64_t per = QBLOCK * K::SUBS;
#pragma omp parallel for if (n >= 16)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = s.row_map != nullptr ? s.row_map[ids[i]] : ids[i];
      for (int64_t b = 0; b < cols / per; ++b) K::dequantize(s.data + r * s.row_bytes + b * K::BYTES, out + i * cols + b * per);
    }
  });
}

// Rows [r0, r1) of a block matrix (its segments stacked) dequantised, exactly as dequantize_rows
// does, then rounded to bf16: out [r1 - r0, cols]. The panel a bf16 GEMM (oneDNN's, AMX where the
// CPU has it) multiplies by a prefill chunk's rows (runtime/models/linear.py's BlockLinear).
void dequantize_panel_bf16(const BlockMatrix& m, int64_t r0, int64_t r1, bf16* out) {
#pragma omp parallel for schedule(static)
  for (int64_t r = r0; r < r1; ++r) {
    int64_t i = r, seg = 0;
    while (i >= m.segment[seg].rows) i -= m.segment[seg++].rows;
    const BlockSegment& s = m.segment[seg];
    const uint8_t* row = s.data + (s.row_map != nullptr ? s.row_map[i] : i) * s.row_bytes;
    bf16* o = out + (r - r0) * m.cols;
    with_kind(s.kind, [&](auto k) {
      using K = decltype(k);
      constexpr int64_t per = QBLOCK * K::SUBS;
      for (int64_t b = 0; b < m.cols / per; ++b) {
#if defined(__AVX2__) && defined(__FMA__)
        dequantize_bf16<K>(row + b * K::BYTES, o + b * per);
#else
        float y[per];
        K::dequantize(row + b * K::BYTES, y);
        for (int64_t l = 0; l < per; ++l) o[b * per + l] = from_f<bf16>(y[l]);
#endif
      }
    });
  }
}

// ---- prefill GEMM on int8 panels (VNNI) ----------------------------------------------------------
// A prefill's rows (hundreds to thousands) against a block-quantized matrix. The block tiles above
// hold a token a lane and broadcast a weight chunk, which leaves them well under the multiply
// rate; here a panel of weight rows is first repacked (once per call, while every token passes
// it) into signed int8 with the rows across the lanes, and a register tile of GEMM_MR tokens by 16
// weight rows runs one dpbusd a chunk, each token's four values broadcast. Per block the int32
// sums take their float scale (and zero) in two or three operations; the activations carry one
// scale per super-block of 256 (llama.cpp's Q8_K), which multiplies once per eight blocks.
// On a 2-core Zen 4 EPYC, 1.2-1.6x oneDNN's bf16 GEMM over dequantised panels and 1.2-2.4x the
// block tiles from 64 rows (bench/gemm.py --rows 64 128 512); a 1B-shaped Q4_K_M's prefill of 2,000
// tokens 15.1 -> 12.0 s against the bf16 panels (bench/gemm.py --prefill 2000 --model ...). Its
// rounding is its own, as the bf16 panels' is.
//
// dpbusd multiplies u8 by s8: the activations go in as u8 (int8 + 128) and each block's sum starts
// from -128 * (its weights' sum), so the int32 sums are those of the signed values, exactly.
// Weights as int8 w with w_float = scale * w + zero:
//   Q8_0 q, Q4_0 q - 8, MXFP4 kMxfp4[code] (no zero); Q4_1 q (+ m), Q4_K / Q5_K q (- dmin * m);
//   Q6_K u - 32 under a scale per 16 weights (d * sc), i.e. two "halves" a block.
#if defined(__AVX2__) && defined(__FMA__) && RS_VNNI
#define RS_INT8_GEMM 1
constexpr int GEMM_NR = 16;  // weight rows a tile: two vectors of eight lanes
// tokens a register tile: with 32 vector registers (AVX512VL), 4 x 2 int32 sums, super-block and
// total float sums (24) fit beside the weights and the broadcast; with 16 (AVX-VNNI), 2
#ifdef __AVX512VL__
constexpr int GEMM_MR = 4;
#else
constexpr int GEMM_MR = 2;
#endif
// a tile's block: weights [chunk 8][row 16][4 bytes], then int32 starts [half 2][16], float scales
// [half 2][16], float zeros [16]
constexpr int64_t TB_W = 0, TB_START = 512, TB_SCALE = 640, TB_ZERO = 768, TB_BYTES = 832;

template <class K> constexpr bool gemm_halves = std::is_same<K, Q6_K>::value;
template <class K> constexpr bool gemm_zero = std::is_same<K, Q4_1>::value || kmins<K>;

// A tile from its 16 weight rows (null: a padding row, all zero): signed int8 weights, their
// starts (-128 x their sums per scale group), scales and zeros; a super-block of every row at a
// time, so that its blocks of the tile stay in L1 while they fill
template <class K>
void gemm_pack_tile(const uint8_t* const* rows, int64_t cols, uint8_t* tile) {
  for (int64_t s = 0; s < cols / (QBLOCK * K::SUBS); ++s)
    for (int r = 0; r < GEMM_NR; ++r) {
      if (rows[r] == nullptr) {
        for (int j = 0; j < K::SUBS; ++j) {
          uint8_t* tb = tile + (s * K::SUBS + j) * TB_BYTES;
          for (int c = 0; c < 8; ++c) std::memset(tb + TB_W + 64 * c + 4 * r, 0, 4);
          for (int64_t f : {TB_START, TB_START + 64, TB_SCALE, TB_SCALE + 64, TB_ZERO}) std::memset(tb + f + 4 * r, 0, 4);
        }
        continue;
      }
      const uint8_t* p = rows[r] + s * K::BYTES;
      Header<K::SUBS> h;
      K::header(p, h);
      for (int j = 0; j < K::SUBS; ++j) {
        uint8_t* tb = tile + (s * K::SUBS + j) * TB_BYTES;
        __m256i w = weights(K{}, p, j);
        if constexpr (std::is_same<K, Q4_0>::value) w = _mm256_sub_epi8(w, _mm256_set1_epi8(8));
        if constexpr (std::is_same<K, MXFP4>::value) w = _mm256_sub_epi8(w, _mm256_set1_epi8(12));
        if constexpr (std::is_same<K, Q6_K>::value) w = _mm256_sub_epi8(w, _mm256_set1_epi8(32));
        // the sums of w + 128 by eight bytes; less 128 a byte, times -128: the starts
        const __m256i sums = _mm256_sad_epu8(_mm256_xor_si256(w, _mm256_set1_epi8(char(0x80))), _mm256_setzero_si256());
        const int64_t lo = _mm256_extract_epi64(sums, 0) + _mm256_extract_epi64(sums, 1) - 16 * 128;
        const int64_t hi = _mm256_extract_epi64(sums, 2) + _mm256_extract_epi64(sums, 3) - 16 * 128;
        alignas(32) int32_t v[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(v), w);
        for (int c = 0; c < 8; ++c) std::memcpy(tb + TB_W + 64 * c + 4 * r, v + c, 4);
        int32_t* start = reinterpret_cast<int32_t*>(tb + TB_START);
        float* scale = reinterpret_cast<float*>(tb + TB_SCALE);
        if constexpr (gemm_halves<K>) {  // sub-scales 2k (weights 0-15) and 2k + 1 of half j / 4
          start[r] = int32_t(-128 * lo);
          start[16 + r] = int32_t(-128 * hi);
          for (int half = 0; half < 2; ++half) scale[16 * half + r] = h.d * float(int8_t(p[192 + 8 * (j / 4) + 2 * (j % 4) + half]));
        } else {
          start[r] = int32_t(-128 * (lo + hi));
          scale[r] = h.scale[j];
          if constexpr (gemm_zero<K>) reinterpret_cast<float*>(tb + TB_ZERO)[r] = h.zero[j];
        }
      }
    }
}

// Activations [n, cols] for the GEMM: u8 (int8 + 128) per super-block of 256 with its scale, and
// each block's int8 sum as a float (the zeros' term)
struct GemmActs {
  uint8_t* xu;    // [n][cols]
  float* isum;    // [n][cols / 32]
  float* scale;   // [n][cols / 256]
};

inline void gemm_quantize_row(const float* x, int64_t cols, uint8_t* xu, float* isum, float* scale) {
  for (int64_t c = 0; c < cols; c += QK) {
    float top = 0.f;
    for (int64_t b = 0; b < QK; b += QBLOCK) top = std::max(top, block_top(x + c + b));
    int16_t halves[2 * QK / QBLOCK];
    round_group(x + c, top, reinterpret_cast<int8_t*>(xu + c), halves);
    for (int64_t b = 0; b < QK / QBLOCK; ++b) {
      isum[c / QBLOCK + b] = float(halves[2 * b] + halves[2 * b + 1]);
      const __m256i v = load32(xu + c + b * QBLOCK);  // int8 + 128, as u8
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xu + c + b * QBLOCK), _mm256_xor_si256(v, _mm256_set1_epi8(char(0x80))));
    }
    scale[c / QK] = top / 127.0f;
  }
}

// out[t][0..16) for MT (<= GEMM_MR) tokens from x row t0 against one tile of nb blocks
template <class K, int MT>
inline void gemm_tile(const uint8_t* tile, int64_t nb, const GemmActs& a, int64_t cols, int64_t t0, float* out,
                      int64_t out_stride) {
  __m256 f[MT][2], g[MT][2];
  for (int t = 0; t < MT; ++t) f[t][0] = f[t][1] = g[t][0] = g[t][1] = _mm256_setzero_ps();
  const uint8_t* x[MT];
  for (int t = 0; t < MT; ++t) x[t] = a.xu + (t0 + t) * cols;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* tb = tile + b * TB_BYTES;
    const __m256i* start = reinterpret_cast<const __m256i*>(tb + TB_START);
    const float* scale = reinterpret_cast<const float*>(tb + TB_SCALE);
    __m256i acc[MT][2];
    for (int half = 0; half < (gemm_halves<K> ? 2 : 1); ++half) {
      const __m256i s0 = _mm256_load_si256(start + 2 * half), s1 = _mm256_load_si256(start + 2 * half + 1);
      for (int t = 0; t < MT; ++t) acc[t][0] = s0, acc[t][1] = s1;
#pragma GCC unroll 8
      for (int c = 0; c < (gemm_halves<K> ? 4 : 8); ++c) {
        const int cc = c + 4 * half;
        __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(tb + TB_W + 64 * cc));
        __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(tb + TB_W + 64 * cc + 32));
        // in registers: GCC otherwise folds the loads into every token's dpbusd, and the tile then
        // waits on 1.5 loads a multiply (Q8_0 3072 x 2048 at 2,048 rows: ~350 against ~560 GOP/s,
        // bench/gemm.py --rows 2048)
        asm("" : "+v"(w0), "+v"(w1));
        for (int t = 0; t < MT; ++t) {
          int32_t v;
          std::memcpy(&v, x[t] + b * QBLOCK + 4 * cc, 4);
          const __m256i xb = _mm256_set1_epi32(v);
          acc[t][0] = dpbusd(acc[t][0], xb, w0);
          acc[t][1] = dpbusd(acc[t][1], xb, w1);
        }
      }
      const __m256 sc0 = _mm256_load_ps(scale + 16 * half), sc1 = _mm256_load_ps(scale + 16 * half + 8);
      for (int t = 0; t < MT; ++t) {
        g[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t][0]), sc0, g[t][0]);
        g[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t][1]), sc1, g[t][1]);
      }
    }
    if constexpr (gemm_zero<K>) {
      const float* zero = reinterpret_cast<const float*>(tb + TB_ZERO);
      const __m256 z0 = _mm256_load_ps(zero), z1 = _mm256_load_ps(zero + 8);
      for (int t = 0; t < MT; ++t) {
        const __m256 s = _mm256_set1_ps(a.isum[(t0 + t) * (cols / QBLOCK) + b]);
        g[t][0] = _mm256_fmadd_ps(z0, s, g[t][0]);
        g[t][1] = _mm256_fmadd_ps(z1, s, g[t][1]);
      }
    }
    if (b % 8 == 7) {  // a super-block's sums take the tokens' scales
      for (int t = 0; t < MT; ++t) {
        const __m256 xs = _mm256_set1_ps(a.scale[(t0 + t) * (cols / QK) + b / 8]);
        f[t][0] = _mm256_fmadd_ps(g[t][0], xs, f[t][0]);
        f[t][1] = _mm256_fmadd_ps(g[t][1], xs, f[t][1]);
        g[t][0] = g[t][1] = _mm256_setzero_ps();
      }
    }
  }
  for (int t = 0; t < MT; ++t) {
    _mm256_storeu_ps(out + t * out_stride, f[t][0]);
    _mm256_storeu_ps(out + t * out_stride + 8, f[t][1]);
  }
}

// gemm_tile for mt in 1..GEMM_MR tokens
template <class K>
inline void gemm_tiles(int64_t mt, const uint8_t* tile, int64_t nb, const GemmActs& a, int64_t cols, int64_t t0, float* y) {
  if (mt == GEMM_MR) return gemm_tile<K, GEMM_MR>(tile, nb, a, cols, t0, y, GEMM_NR);
  if (mt == 1) return gemm_tile<K, 1>(tile, nb, a, cols, t0, y, GEMM_NR);
  if constexpr (GEMM_MR > 2) {
    if (mt == 2) return gemm_tile<K, 2>(tile, nb, a, cols, t0, y, GEMM_NR);
    gemm_tile<K, 3>(tile, nb, a, cols, t0, y, GEMM_NR);
  }
}

// Weight rows a panel repacks at a time: its tiles stay in L2 while every token passes them
constexpr int64_t GEMM_PANEL_BYTES = 256 << 10;

// out [n, m.rows] = x [n, m.cols] times the weight^T (+ bias); m.cols a multiple of 256
void block_gemm(const BlockMatrix& m, const float* x, int64_t n, float* out) {
  const int64_t cols = m.cols, nb = cols / QBLOCK;
  const int64_t panel_rows = std::clamp<int64_t>(GEMM_PANEL_BYTES / cols / GEMM_NR * GEMM_NR, GEMM_NR, 256);
  uint8_t* scratch = static_cast<uint8_t*>(std::malloc(n * cols + sizeof(float) * (n * nb + n * (cols / QK))));
  GemmActs a{scratch, reinterpret_cast<float*>(scratch + n * cols), nullptr};
  a.scale = a.isum + n * nb;
  // (segment, first row) of every panel
  std::vector<std::pair<int64_t, int64_t>> panels;
  int64_t row0[3] = {0, 0, 0};
  for (int64_t i = 0; i < m.n_segments; ++i) {
    if (i > 0) row0[i] = row0[i - 1] + m.segment[i - 1].rows;
    for (int64_t r = 0; r < m.segment[i].rows; r += panel_rows) panels.emplace_back(i, r);
  }
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) gemm_quantize_row(x + t * cols, cols, a.xu + t * cols, a.isum + t * nb, a.scale + t * (cols / QK));
    uint8_t* tiles = static_cast<uint8_t*>(std::aligned_alloc(64, panel_rows / GEMM_NR * nb * TB_BYTES));
    alignas(32) float y[GEMM_MR * GEMM_NR];
#pragma omp for schedule(dynamic, 1)
    for (int64_t pi = 0; pi < int64_t(panels.size()); ++pi) {
      const BlockSegment& s = m.segment[panels[pi].first];
      const int64_t r0 = panels[pi].second, rows = std::min(panel_rows, s.rows - r0);
      const int64_t ntiles = (rows + GEMM_NR - 1) / GEMM_NR;
      with_kind(s.kind, [&](auto k) {
        using K = decltype(k);
        for (int64_t tt = 0; tt < ntiles; ++tt) {
          const uint8_t* w[GEMM_NR];
          for (int64_t j = 0; j < GEMM_NR; ++j) {
            const int64_t i = r0 + tt * GEMM_NR + j;
            w[j] = tt * GEMM_NR + j < rows ? s.data + (s.row_map != nullptr ? s.row_map[i] : i) * s.row_bytes : nullptr;
          }
          gemm_pack_tile<K>(w, cols, tiles + tt * nb * TB_BYTES);
        }
        for (int64_t t0 = 0; t0 < n; t0 += GEMM_MR) {
          const int64_t mt = std::min<int64_t>(GEMM_MR, n - t0);
          for (int64_t tt = 0; tt < ntiles; ++tt) {
            const uint8_t* tile = tiles + tt * nb * TB_BYTES;
            gemm_tiles<K>(mt, tile, nb, a, cols, t0, y);
            const int64_t c0 = row0[panels[pi].first] + r0 + tt * GEMM_NR, width = std::min<int64_t>(GEMM_NR, rows - tt * GEMM_NR);
            for (int64_t t = 0; t < mt; ++t)
              for (int64_t j = 0; j < width; ++j)  // the bias after the sum, as a separate add rounds
                out[(t0 + t) * m.rows + c0 + j] = m.bias != nullptr ? y[t * GEMM_NR + j] + m.bias[c0 + j] : y[t * GEMM_NR + j];
          }
        }
      });
    }
    std::free(tiles);
  }
  std::free(scratch);
}
#else
#define RS_INT8_GEMM 0
#endif

// ---- one decoder layer of a pure-decode step ------------------------------------------------------
// A float32 model whose four linear layers are block-quantized (runtime/models/fused_decode.py):
// norm -> qkv -> (q/k norms) -> RoPE -> K/V write -> attention -> o -> norm -> gate-up -> SiLU -> down
// in one call and one OpenMP team, instead of ~10 calls from Python, each returning to the
// interpreter (~9 us a call, ~300 a step). Each stage is the separate kernels' own code: the
// results are identical. A MoE layer (no gate-up rows) stops at its MLP's normed input, which it
// leaves in `delta` for the experts' own call.
struct LayerWeights {
  BlockMatrix qkv, o, gate_up, down;
  const float* input_norm;
  const float* post_norm;
  float eps;
  const float* q_norm;  // [d] each query head's RMS norm weight (Qwen3), or null
  const float* k_norm;  // [d] each key head's
};

struct DecodeStep {
  float* x;                   // [rows, hidden] the residual stream, updated in place
  float* delta;               // [rows, hidden] the previous layer's MLP output in, this layer's out
  int64_t rows;
  const float* cos;           // rope tables [max_len, d]
  const float* sin;
  const int64_t* positions;   // [rows]
  const int64_t* out_slots;   // [rows] the KV slot of each row's new token
  const PagedDecode* attention;
};

// A decode step's ends around its layers: its tokens' embedding rows before the first, the final
// norm and the LM head after the last
struct DecodeEnds {
  const BlockSegment* embed;  // the embedding table's blocks, or null where the caller fills x
  int64_t vocab;              // rows of the embedding table
  const float* norm;          // [hidden] the final RMS norm's weight
  float eps;
  const BlockMatrix* head;    // the LM head
};

void decoder_layer(const LayerWeights& w, const DecodeStep& s, int64_t layer, bool has_delta) {
  const PagedDecode& p = *s.attention;
  const int64_t n = s.rows, hidden = w.qkv.cols, d = p.d, heads = p.heads;
  const int64_t qkv_width = w.qkv.rows, q_width = heads * d, kv_width = p.kv_heads * d, inter = w.down.cols;
  float* h = static_cast<float*>(
      std::malloc(sizeof(float) * n * (2 * hidden + qkv_width + q_width + w.gate_up.rows + inter)));
  float* o = h + n * hidden;
  float* qkv = o + n * hidden;
  float* att = qkv + n * qkv_width;
  float* gate_up = att + n * q_width;
  float* act = gate_up + n * w.gate_up.rows;
  QuantizedRows a(n, std::max({hidden, q_width, inter}));
  float* k_cache = static_cast<float*>(const_cast<void*>(p.k_cache)) + layer * p.layer_stride;
  float* v_cache = static_cast<float*>(const_cast<void*>(p.v_cache)) + layer * p.layer_stride;
  // row r of x [n, cols] as the next matmul reads it
  const auto quantize = [&](const float* x, int64_t r, int64_t cols) { a.quantize(x + r * cols, r, 0, cols, cols); };
#pragma omp parallel
  {
#pragma omp for
    for (int64_t r = 0; r < n; ++r) {
      add_rms_norm_row<float>(s.x + r * hidden, has_delta ? s.delta + r * hidden : nullptr, w.input_norm,
                              h + r * hidden, hidden, w.eps);
      quantize(h, r, hidden);
    }
    matmul_team(w.qkv, n, a.view(hidden), qkv);
#pragma omp for
    for (int64_t r = 0; r < n; ++r) {
      float* row = qkv + r * qkv_width;  // [q heads | k heads | v heads]
      if (w.q_norm != nullptr) head_rms_norms(row, heads, p.kv_heads, d, w.q_norm, w.k_norm, w.eps);
      rope_row<float>(row, heads + p.kv_heads, d, s.cos + s.positions[r] * d, s.sin + s.positions[r] * d);
      std::memcpy(k_cache + s.out_slots[r] * kv_width, row + q_width, kv_width * sizeof(float));
      std::memcpy(v_cache + s.out_slots[r] * kv_width, row + q_width + kv_width, kv_width * sizeof(float));
    }
    decode_attention_team<float>(p, layer, qkv, qkv_width, n, nullptr, att);
#pragma omp for
    for (int64_t r = 0; r < n; ++r) quantize(att, r, q_width);
    matmul_team(w.o, n, a.view(q_width), o);
    const bool mlp = w.gate_up.rows > 0;
#pragma omp for
    for (int64_t r = 0; r < n; ++r) {
      add_rms_norm_row<float>(s.x + r * hidden, o + r * hidden, w.post_norm, (mlp ? h : s.delta) + r * hidden,
                              hidden, w.eps);
      if (mlp) quantize(h, r, hidden);
    }
    if (mlp) {  // else a MoE layer: the experts take `delta` from here
      matmul_team(w.gate_up, n, a.view(hidden), gate_up);
      // by spans of a row, not rows: at one token a row is one thread's work (a span is a
      // super-block where the K-quants' form is made, which needs its 256 values together)
      const int64_t span = inter % QK == 0 ? QK : QBLOCK, spans = inter / span;
#pragma omp for
      for (int64_t rs = 0; rs < n * spans; ++rs) {
        const int64_t r = rs / spans, c = rs % spans * span;
        silu_mul_row<float>(gate_up + r * 2 * inter + c, gate_up + r * 2 * inter + inter + c, act + r * inter + c, span);
        a.quantize(act + r * inter, r, c, span, inter);
      }
      matmul_team(w.down, n, a.view(inter), s.delta);
    }
  }
  std::free(h);
}

// ---- dense experts of a MoE layer (float32 or bfloat16 weights) -----------------------------------
// A decode step's experts in one call: each chosen expert's gate-up rows, then the activation, then
// its down rows, then each token's weighted sum in expert order. Tokens routed to the same expert
// share each weight row while it is in L1. A (token, expert) pair's dot products run in the same
// order whatever else is in the batch, so a token's output is the same alone or batched.
struct DenseExperts {
  const void* const* gate_up;         // per expert: [2 * inter, hidden] rows [gate | up]
  const void* const* down;            // per expert: [hidden, inter]
  const float* const* gate_up_bias;   // per expert, or null: [2 * inter] float32
  const float* const* down_bias;      // per expert, or null: [hidden] float32
  int64_t experts, hidden, inter;
  int64_t clamped;                    // 0: silu(gate) * up; 1: gpt-oss's clamped SwiGLU
  float limit, alpha;
};

// out[t] = dot(w, x[t]) for NT tokens reading the same weight row (each token's sums in the same
// order for any NT)
template <class T, int NT>
inline void dot_row(const T* w, const float* const* x, int64_t n, float* out) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc[NT][2];
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = load8(w + i), w1 = load8(w + i + 8);
    for (int t = 0; t < NT; ++t) {
      acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + i), acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[t] + i + 8), acc[t][1]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
#else
  for (int t = 0; t < NT; ++t) out[t] = 0.0f;
#endif
  for (int t = 0; t < NT; ++t)
    for (int64_t j = i; j < n; ++j) out[t] += to_f(w[j]) * x[t][j];
}

// rows [r0, r1) of `w` ([rows, n]) against the tokens of one expert: y[p][r] for p in pairs
template <class T>
void expert_rows(const T* w, const float* bias, int64_t n, int64_t r0, int64_t r1, const float* const* x,
                 float* const* y, int64_t count) {
  float res[4];
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = w + r * n;
    if (r + 1 < r1) __builtin_prefetch(row + n);
    const float b = bias ? bias[r] : 0.0f;
    int64_t p = 0;
    for (; p + 4 <= count; p += 4) {
      dot_row<T, 4>(row, x + p, n, res);
      for (int q = 0; q < 4; ++q) y[p + q][r] = res[q] + b;
    }
    for (; p < count; ++p) {
      dot_row<T, 1>(row, x + p, n, res);
      y[p][r] = res[0] + b;
    }
  }
}

inline float expert_act(int64_t clamped, float limit, float alpha, float g, float u) {
  if (!clamped) return g / (1.0f + std::exp(-g)) * u;
  g = std::min(g, limit);
  u = std::max(std::min(u, limit), -limit);
  return (u + 1.0f) * (g / (1.0f + std::exp(-alpha * g)));
}

// A step's (token, expert) pairs p = t * k + j, sorted by (expert, token): positions
// start[e]..start[e + 1] hold expert e's tokens, ascending
struct ExpertPairs {
  std::vector<int64_t> start, pos_of, token, used;
  ExpertPairs(const int64_t* ids, int64_t n_tok, int64_t k, int64_t experts)
      : start(experts + 1, 0), pos_of(n_tok * k), token(n_tok * k) {
    for (int64_t p = 0; p < n_tok * k; ++p) start[ids[p] + 1]++;
    for (int64_t e = 0; e < experts; ++e) start[e + 1] += start[e];
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t p = 0; p < n_tok * k; ++p) {
      pos_of[p] = next[ids[p]]++;
      token[pos_of[p]] = p / k;
    }
    for (int64_t e = 0; e < experts; ++e)
      if (start[e + 1] > start[e]) used.push_back(e);
  }
};

// out[t] = the sum over t's experts, in ascending id, of its router weight times the expert's
// output row y[pos] (width H). Called by every thread of a team.
inline void combine_team(const ExpertPairs& pr, const int64_t* ids, const float* weights, int64_t n_tok, int64_t k,
                         const float* y, int64_t H, float* out) {
#pragma omp for schedule(static)
  for (int64_t t = 0; t < n_tok; ++t) {
    std::vector<int64_t> slots(k);   // a token's experts are distinct
    for (int64_t j = 0; j < k; ++j) slots[j] = j;
    std::sort(slots.begin(), slots.end(), [&](int64_t u, int64_t v) { return ids[t * k + u] < ids[t * k + v]; });
    float* o = out + t * H;
    std::fill(o, o + H, 0.0f);
    for (int64_t j : slots) {
      const float w = weights[t * k + j];
      const float* yp = y + pr.pos_of[t * k + j] * H;
      for (int64_t c = 0; c < H; ++c) o[c] += w * yp[c];
    }
  }
}

template <class T>
void dense_experts(const DenseExperts& m, const float* x, int64_t n_tok, const int64_t* ids, const float* weights,
                   int64_t k, float* out) {
  const int64_t H = m.hidden, I = m.inter, P = n_tok * k;
  const ExpertPairs pr(ids, n_tok, k, m.experts);
  std::vector<float> h(P * 2 * I), a(P * I), y(P * H);
  std::vector<const float*> xs(P), as(P);
  std::vector<float*> hs(P), ys(P);
  for (int64_t pos = 0; pos < P; ++pos) {
    xs[pos] = x + pr.token[pos] * H;
    hs[pos] = h.data() + pos * 2 * I;
    as[pos] = a.data() + pos * I;
    ys[pos] = y.data() + pos * H;
  }
  constexpr int64_t CHUNK = 16;   // rows a work item: enough items for the team at one token
  const int64_t n_used = pr.used.size(), gu_chunks = (2 * I + CHUNK - 1) / CHUNK, down_chunks = (H + CHUNK - 1) / CHUNK;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t item = 0; item < n_used * gu_chunks; ++item) {
      const int64_t e = pr.used[item / gu_chunks], r0 = item % gu_chunks * CHUNK, g0 = pr.start[e];
      expert_rows<T>(static_cast<const T*>(m.gate_up[e]), m.gate_up_bias ? m.gate_up_bias[e] : nullptr, H, r0,
                     std::min(r0 + CHUNK, 2 * I), xs.data() + g0, hs.data() + g0, pr.start[e + 1] - g0);
    }
#pragma omp for schedule(static)
    for (int64_t pos = 0; pos < P; ++pos)
      for (int64_t i = 0; i < I; ++i) a[pos * I + i] = expert_act(m.clamped, m.limit, m.alpha, hs[pos][i], hs[pos][I + i]);
#pragma omp for schedule(static)
    for (int64_t item = 0; item < n_used * down_chunks; ++item) {
      const int64_t e = pr.used[item / down_chunks], r0 = item % down_chunks * CHUNK, g0 = pr.start[e];
      expert_rows<T>(static_cast<const T*>(m.down[e]), m.down_bias ? m.down_bias[e] : nullptr, I, r0,
                     std::min(r0 + CHUNK, H), as.data() + g0, ys.data() + g0, pr.start[e + 1] - g0);
    }
    combine_team(pr, ids, weights, n_tok, k, y.data(), H, out);
  }
}

// The same for block-quantized experts (a GGUF's stacked expert tensors, one BlockMatrix view per
// expert): each expert's tokens are quantized and multiplied by the block kernels as one batch, so
// a token's row is the same alone or batched, as everywhere on the block kernels.
struct BlockExperts {
  const BlockMatrix* gate_up;   // per expert: [2 * inter, hidden], rows [gate | up], bias included
  const BlockMatrix* down;      // per expert: [hidden, inter]
  int64_t experts, hidden, inter, clamped;
  float limit, alpha;
};

void block_experts(const BlockExperts& m, const float* x, int64_t n_tok, const int64_t* ids, const float* weights,
                   int64_t k, float* out) {
  const int64_t H = m.hidden, I = m.inter, P = n_tok * k;
  const ExpertPairs pr(ids, n_tok, k, m.experts);
  const int64_t n_used = pr.used.size();
  std::vector<float> h(P * 2 * I), a(P * I), y(P * H);
  std::vector<std::unique_ptr<QuantizedRows>> qx, qa;
  for (int64_t e : pr.used) {
    qx.emplace_back(new QuantizedRows(pr.start[e + 1] - pr.start[e], H));
    qa.emplace_back(new QuantizedRows(pr.start[e + 1] - pr.start[e], I));
  }
#pragma omp parallel
  {
    for (int64_t u = 0; u < n_used; ++u) {
      const int64_t e = pr.used[u], g0 = pr.start[e], count = pr.start[e + 1] - g0;
#pragma omp for schedule(static)
      for (int64_t i = 0; i < count; ++i) qx[u]->quantize(x + pr.token[g0 + i] * H, i, 0, H, H);
      matmul_team(m.gate_up[e], count, qx[u]->view(H), h.data() + g0 * 2 * I);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < count; ++i) {
        const float* g = h.data() + (g0 + i) * 2 * I;
        float* act = a.data() + (g0 + i) * I;
        for (int64_t c = 0; c < I; ++c) act[c] = expert_act(m.clamped, m.limit, m.alpha, g[c], g[I + c]);
        qa[u]->quantize(act, i, 0, I, I);
      }
      matmul_team(m.down[e], count, qa[u]->view(I), y.data() + g0 * H);
    }
    combine_team(pr, ids, weights, n_tok, k, y.data(), H, out);
  }
}

// ---- greedy sampling ----------------------------------------------------------------------------
// The index of the largest of x[0..n): the first on ties, and the first NaN where there is one (as
// torch's argmax). One pass for the maximum (four chains: vmaxps waits on its last result), then
// one for its first place, which ends where it is found. One call instead of the chunked torch
// path's eight ops, which run cold after a step's weights have streamed through the caches: a
// greedy one-row Sampler.sample took 0.43 -> 0.22 ms so (0.031 -> 0.021 warm; 32 rows warm 0.127
// -> 0.079; bench/sampler.py --rows 1 --cold-mb 96 --argmax torch|kernels, on a Zen 4 EPYC).
int64_t argmax_row(const float* x, int64_t n) {
  int64_t i = 0;
  float best = -INFINITY;
  bool nan = false;
#if defined(__AVX2__)
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0, un = _mm256_setzero_ps();
  for (; i + 32 <= n; i += 32) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    const __m256 c = _mm256_loadu_ps(x + i + 16), d = _mm256_loadu_ps(x + i + 24);
    m0 = _mm256_max_ps(m0, a), m1 = _mm256_max_ps(m1, b), m2 = _mm256_max_ps(m2, c), m3 = _mm256_max_ps(m3, d);
    un = _mm256_or_ps(un, _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q), _mm256_cmp_ps(c, d, _CMP_UNORD_Q)));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
  for (float v : lanes) best = std::max(best, v);
  nan = _mm256_movemask_ps(un) != 0;
#endif
  for (; i < n; ++i) {
    nan |= std::isnan(x[i]);
    best = std::max(best, x[i]);
  }
  if (nan) {
    for (int64_t j = 0; j < n; ++j)
      if (std::isnan(x[j])) return j;
  }
  int64_t j = 0;
#if defined(__AVX2__)
  const __m256 b = _mm256_set1_ps(best);
  for (; j + 8 <= n; j += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), b, _CMP_EQ_OQ));
    if (hit != 0) return j + __builtin_ctz(hit);
  }
#endif
  for (; j < n; ++j)
    if (x[j] == best) return j;
  return 0;  // n == 0
}

// ---- token bitmask: a grammar's allowed tokens ---------------------------------------------------
// Logits of disallowed tokens become -inf (bits of the logit's own width, so an allowed NaN stays
// NaN and no float compare runs). Bit j of word w allows token 32w + j; columns from `limit` on are
// disallowed. Rows `rows` (all when null) of logits and bitmask alike. A word of all ones (inside a
// JSON string, most of a row) is skipped; the select loop vectorises (vpsrlvd + blend).
template <typename U>
void token_bitmask(U* logits, int64_t row_stride, const uint32_t* bitmask, int64_t mask_stride, const int64_t* rows,
                   int64_t n_rows, int64_t n_cols, int64_t limit, U neg_inf) {
  const int64_t full = limit / 32;
  for (int64_t i = 0; i < n_rows; ++i) {
    const int64_t r = rows ? rows[i] : i;
    U* row = logits + r * row_stride;
    const uint32_t* words = bitmask + r * mask_stride;
    for (int64_t w = 0; w < full; ++w) {
      const uint32_t word = words[w];
      if (word == 0xFFFFFFFFu) continue;
      U* x = row + w * 32;
      for (int j = 0; j < 32; ++j) {
        const U keep = static_cast<U>(0) - static_cast<U>((word >> j) & 1u);
        x[j] = static_cast<U>((x[j] & keep) | (neg_inf & ~keep));
      }
    }
    for (int64_t c = full * 32; c < n_cols; ++c)
      if (c >= limit || !((words[c >> 5] >> (c & 31)) & 1u)) row[c] = neg_inf;
  }
}

}  // namespace

// ---- entry points: one per dtype (f32: float32, bf16: bfloat16) ----------------------------------
#define RS_EXPORT extern "C" __attribute__((visibility("default")))
#define RS_BOTH(MACRO) MACRO(f32, float) MACRO(bf16, bf16)

#define RS_ADD_RMS_NORM(NAME, T)                                                                             \
  RS_EXPORT void rs_add_rms_norm_##NAME(float* x, const void* delta, int64_t delta_stride, const float* w,    \
                                        void* out, int64_t rows, int64_t d, float eps) {                      \
    add_rms_norm<T>(x, static_cast<const T*>(delta), delta_stride, w, static_cast<T*>(out), rows, d, eps);    \
  }
RS_BOTH(RS_ADD_RMS_NORM)

#define RS_ROPE(NAME, T)                                                                                      \
  RS_EXPORT void rs_rope_##NAME(void* x, int64_t row_stride, int64_t rows, int64_t heads, int64_t d,          \
                                const void* cos, const void* sin, const int64_t* positions) {                 \
    rope<T>(static_cast<T*>(x), row_stride, rows, heads, d, static_cast<const T*>(cos),                       \
            static_cast<const T*>(sin), positions);                                                           \
  }
RS_BOTH(RS_ROPE)

// rows of [q heads | k heads | ...] (float32, row_stride apart), each head RMS-normed in place
RS_EXPORT void rs_head_rms_norms(float* x, int64_t row_stride, int64_t rows, int64_t heads, int64_t kv_heads, int64_t d,
                                 const float* q_norm, const float* k_norm, float eps) {
#pragma omp parallel for if (rows >= 16)
  for (int64_t r = 0; r < rows; ++r) head_rms_norms(x + r * row_stride, heads, kv_heads, d, q_norm, k_norm, eps);
}

#define RS_SILU_MUL(NAME, T)                                                                                  \
  RS_EXPORT void rs_silu_mul_##NAME(const void* gate_up, int64_t rows, int64_t inter, void* out) {            \
    silu_mul<T>(static_cast<const T*>(gate_up), rows, inter, static_cast<T*>(out));                           \
  }
RS_BOTH(RS_SILU_MUL)

#define RS_WRITE_KV(NAME, T)                                                                                  \
  RS_EXPORT void rs_write_kv_##NAME(void* k_cache, void* v_cache, const int64_t* slots, const void* k,        \
                                    int64_t k_stride, const void* v, int64_t v_stride, int64_t rows,          \
                                    int64_t width) {                                                          \
    write_kv<T>(static_cast<T*>(k_cache), static_cast<T*>(v_cache), slots, static_cast<const T*>(k), k_stride, \
                static_cast<const T*>(v), v_stride, rows, width);                                             \
  }
RS_BOTH(RS_WRITE_KV)

#define RS_DECODE_ATTENTION(NAME, T)                                                                          \
  RS_EXPORT void rs_decode_attention_##NAME(const PagedDecode* p, int64_t layer, const void* q, int64_t q_stride, \
                                            int64_t rows, const float* sinks, void* out) {                      \
    _Pragma("omp parallel") decode_attention_team<T>(*p, layer, static_cast<const T*>(q), q_stride, rows, sinks, \
                                                     static_cast<T*>(out));                                     \
  }
RS_BOTH(RS_DECODE_ATTENTION)

RS_EXPORT void rs_block_linear(const BlockMatrix* m, const float* x, int64_t n, float* out) {
  block_linear(*m, x, n, out);
}

RS_EXPORT void rs_dequantize_rows(const BlockSegment* s, int64_t cols, const int64_t* ids, int64_t n, float* out) {
  dequantize_rows(*s, cols, ids, n, out);
}

// 1 where block_gemm exists (a CPU with VNNI), else 0
RS_EXPORT int64_t rs_int8_gemm_available() { return RS_INT8_GEMM; }

RS_EXPORT void rs_block_gemm(const BlockMatrix* m, const float* x, int64_t n, float* out) {
#if RS_INT8_GEMM
  if (n > 0) block_gemm(*m, x, n, out);
#else
  block_linear(*m, x, n, out);
#endif
}

RS_EXPORT void rs_dequantize_panel_bf16(const BlockMatrix* m, int64_t r0, int64_t r1, void* out) {
  dequantize_panel_bf16(*m, r0, r1, static_cast<bf16*>(out));
}

RS_EXPORT void rs_decoder_layer(const LayerWeights* w, const DecodeStep* s, int64_t layer, int64_t has_delta) {
  decoder_layer(*w, *s, layer, has_delta != 0);
}
// n layers in a row (a model without MoE layers): one call a step, not a Python round trip a
// layer, each of which, right after a layer has streamed its weights through the caches, ran
// slower than its few microseconds warm
RS_EXPORT void rs_decoder_layers(const LayerWeights* const* w, const int64_t* layers, int64_t n, const DecodeStep* s) {
  for (int64_t i = 0; i < n; ++i) decoder_layer(*w[i], *s, layers[i], i > 0);
}

// rows of n float32 logits, row_stride apart -> the index of each row's largest (argmax_row)
RS_EXPORT void rs_argmax_rows(const float* x, int64_t row_stride, int64_t rows, int64_t n, int64_t* out) {
#pragma omp parallel for if (rows > 1)
  for (int64_t r = 0; r < rows; ++r) out[r] = argmax_row(x + r * row_stride, n);
}

// A whole decode step of a model without MoE layers: ids -> logits [rows, head rows], the layers
// framed by the calls the model would make around them (dequantize_rows, add_rms_norm,
// block_linear), so the same results. -1 (nothing done) where an id is outside the embedding.
// (runtime/models/fused_decode.py says what that saves)
RS_EXPORT int64_t rs_decoder_model(const LayerWeights* const* w, const int64_t* layers, int64_t n,
                                   const DecodeStep* s, const DecodeEnds* e, const int64_t* ids, float* logits) {
  const int64_t rows = s->rows, hidden = e->head->cols;
  if (e->embed != nullptr) {
    for (int64_t r = 0; r < rows; ++r)
      if (ids[r] < 0 || ids[r] >= e->vocab) return -1;
    dequantize_rows(*e->embed, hidden, ids, rows, s->x);
  }
  rs_decoder_layers(w, layers, n, s);
  std::unique_ptr<float[]> h(new float[rows * hidden]);
  add_rms_norm<float>(s->x, s->delta, hidden, e->norm, h.get(), rows, hidden, e->eps);
  block_linear(*e->head, h.get(), rows, logits);
  return 0;
}

// logits of 4-byte (float32) or 2-byte (bfloat16, float16) elements; neg_inf: -inf's bits at that width
RS_EXPORT void rs_token_bitmask(void* logits, int64_t elem_bytes, int64_t row_stride, const int32_t* bitmask,
                                int64_t mask_stride, const int64_t* rows, int64_t n_rows, int64_t n_cols,
                                int64_t limit, int64_t neg_inf) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(bitmask);
  if (elem_bytes == 4)
    token_bitmask<uint32_t>(static_cast<uint32_t*>(logits), row_stride, words, mask_stride, rows, n_rows, n_cols,
                            limit, static_cast<uint32_t>(neg_inf));
  else
    token_bitmask<uint16_t>(static_cast<uint16_t*>(logits), row_stride, words, mask_stride, rows, n_rows, n_cols,
                            limit, static_cast<uint16_t>(neg_inf));
}

#define RS_DENSE_EXPERTS(NAME, T)                                                                              \
  RS_EXPORT void rs_dense_experts_##NAME(const DenseExperts* m, const float* x, int64_t n_tok, const int64_t* ids, \
                                         const float* weights, int64_t k, float* out) {                         \
    dense_experts<T>(*m, x, n_tok, ids, weights, k, out);                                                      \
  }
RS_BOTH(RS_DENSE_EXPERTS)

RS_EXPORT void rs_block_experts(const BlockExperts* m, const float* x, int64_t n_tok, const int64_t* ids,
                                const float* weights, int64_t k, float* out) {
  block_experts(*m, x, n_tok, ids, weights, k, out);
}
