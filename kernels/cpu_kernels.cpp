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
#include <type_traits>
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

// out = T(T(silu(g)) * u) over `inter` values
template <class T>
inline void silu_mul_row(const T* g, const T* u, T* out, int64_t inter) {
#pragma omp simd
  for (int64_t i = 0; i < inter; ++i) {
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

// Called by every thread of a team (the loops are orphaned worksharing constructs): q [rows,
// heads, d] with rows q_stride apart -> out [rows, heads, d], against layer `layer`'s caches.
template <class T>
void decode_attention_team(const PagedDecode& p, int64_t layer, const T* q, int64_t q_stride, int64_t rows,
                           T* out) {
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
    // the item's whole K/V rows asked for at once (up to half of L2): each KV head's pass below
    // reads a slice of every row, which the hardware prefetcher follows poorly (attention's share
    // of a step at one user, 130 / 3,000 tokens, fell ~10-25% in alternating runs of a stage-timed
    // build; bench/decode_step.py times the whole step)
    const int64_t ahead = std::min<int64_t>(n, (256 << 10) / (2 * width * int64_t(sizeof(T))));
    for (int64_t j = 0; j < ahead; ++j) {
      const int64_t t = start + j, slot = pages[t / p.page_size] * p.page_size + t % p.page_size;
      const char* kr = reinterpret_cast<const char*>(k_cache + slot * width);
      const char* vr = reinterpret_cast<const char*>(v_cache + slot * width);
      for (int64_t o = 0; o < width * int64_t(sizeof(T)); o += 64) {
        __builtin_prefetch(kr + o, 0, 2);
        __builtin_prefetch(vr + o, 0, 2);
      }
    }
    for (int64_t g = 0; g < p.kv_heads; ++g) {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t t = start + j, slot = pages[t / p.page_size] * p.page_size + t % p.page_size;
        k_rows[j] = k_cache + slot * width + g * d;
        v_rows[j] = v_cache + slot * width + g * d;
      }
      // the queries reading this KV head: every member's heads of its group, in tiles of four
      const int64_t nq = nm * group;
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
        tile_scores(qt, qs, k_rows, n, d, ss);
        for (int64_t i = 0; i < qt; ++i) softmax_weights(ss[i], n, parts[i] + d, parts[i] + d + 1);
        tile_values(qt, const_cast<const float* const*>(ss), v_rows, n, d, parts);
      }
    }
  }
  std::free(k_rows);
  std::free(scores);
#pragma omp for
  for (int64_t bh = 0; bh < rows * heads; ++bh) {
    const int64_t b = bh / heads, h = bh % heads;
    float top = -INFINITY;
    for (int32_t j = p.slot_start[b]; j < p.slot_start[b + 1]; ++j)
      top = std::max(top, p.partials[(p.slots[j] * heads + h) * pw + d]);
    float acc[512] = {0.f};
    float sum = 0.f;
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


// ---- linear layers on block-quantized weights (blocks of 32 along the input dim) ------------------
// w = q * scale + zero per block, q either 4-bit (two per byte: byte j of a block holds q[j] in
// its low and q[j + 16] in its high nibble, GGUF's Q4 order) or int8 (Q8_0, zero 0). A small
// batch is bound by reading the weights (float32 reads 4 bytes a weight, these 0.625 / 1.125)
// and by widening them: the activations are rounded per block to int16 (x = xq * xscale, error
// below 2^-16 of the block's largest value, ~500x finer than the bf16 activations torch's int4
// kernel takes), so that one integer multiply-add handles 16 weights and the dot of a block is
// exact in int32. y = sum_b scale_b * xscale_b * dot(q_b, xq_b) + zero_b * sum(x_b).
constexpr int64_t QBLOCK = 32;

struct Q4 {
  static constexpr int64_t BYTES = 16;  // a block's bytes
  static int32_t get(const uint8_t* p, int j) { return j < 16 ? p[j] & 0x0F : p[j - 16] >> 4; }
};
struct Q8 {
  static constexpr int64_t BYTES = 32;
  static int32_t get(const uint8_t* p, int j) { return int8_t(p[j]); }
};

#if defined(__AVX2__) && defined(__FMA__)
// a block's 32 weights as two vectors of 16 int16
inline void widen(const Q4&, const uint8_t* p, __m256i w[2]) {
  // each byte to 16 bits first: then the high nibble needs only the shift
  const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  w[0] = _mm256_and_si256(v, _mm256_set1_epi16(0x0F));
  w[1] = _mm256_srli_epi16(v, 4);
}
inline void widen(const Q8&, const uint8_t* p, __m256i w[2]) {
  w[0] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  w[1] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
}
// out[r][t] = sum_b scale_b * xscale_b * dot(q_b, xq_b) for NR weight rows (nb blocks each, back
// to back) and NT activation rows
template <class K, int NR, int NT>
inline void tile(const uint8_t* q, const float* scale, int64_t nb, const int16_t* xq, const float* xscale,
                 int64_t cols, float out[NR][NT]) {
  // even and odd blocks add into separate sums: one chain of dependent adds would wait out each
  // add's latency, longer than a block's work at one activation row
  __m256 even[NR][NT], odd[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) even[r][t] = odd[r][t] = _mm256_setzero_ps();
  const auto block = [&](int64_t b, __m256 acc[NR][NT]) __attribute__((always_inline)) {
    for (int r = 0; r < NR; ++r) {
      __m256i w[2];
      widen(K{}, q + (r * nb + b) * K::BYTES, w);
      const __m256 s = _mm256_broadcast_ss(scale + r * nb + b);
      for (int t = 0; t < NT; ++t) {
        const __m256i* xb = reinterpret_cast<const __m256i*>(xq + t * cols + b * QBLOCK);
        const __m256i d = _mm256_add_epi32(_mm256_madd_epi16(w[0], _mm256_loadu_si256(xb)),
                                           _mm256_madd_epi16(w[1], _mm256_loadu_si256(xb + 1)));
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d),
                                    _mm256_mul_ps(s, _mm256_broadcast_ss(xscale + t * nb + b)), acc[r][t]);
      }
    }
  };
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    block(b, even);
    block(b + 1, odd);
  }
  if (b < nb) block(b, even);
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) out[r][t] = hsum(_mm256_add_ps(even[r][t], odd[r][t]));
}
#else
template <class K, int NR, int NT>
inline void tile(const uint8_t* q, const float* scale, int64_t nb, const int16_t* xq, const float* xscale,
                 int64_t cols, float out[NR][NT]) {
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) {
      float acc = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t d = 0;
        for (int j = 0; j < QBLOCK; ++j) d += K::get(q + (r * nb + b) * K::BYTES, j) * xq[t * cols + b * QBLOCK + j];
        acc += float(d) * (scale[r * nb + b] * xscale[t * nb + b]);
      }
      out[r][t] = acc;
    }
}
#endif

// Activations [blocks of 32] rounded to int16 per block: x = xq * xscale; xsum: each block's sum
inline void quantize_blocks(const float* x, int64_t blocks, int16_t* xq, float* xscale, float* xsum) {
  for (int64_t tb = 0; tb < blocks; ++tb) {
    const float* xb = x + tb * QBLOCK;
    int16_t* qb = xq + tb * QBLOCK;
#if defined(__AVX2__) && defined(__FMA__)
    // the scalar loop below did not vectorise: at one token it was the larger part of a layer's
    // SiLU stage
    __m256 v[4], top8 = _mm256_setzero_ps(), sum8 = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      top8 = _mm256_max_ps(top8, _mm256_andnot_ps(sign, v[i]));
      sum8 = _mm256_add_ps(sum8, v[i]);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(top8), _mm256_extractf128_ps(top8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float top = std::max(_mm_cvtss_f32(m4), _mm_cvtss_f32(_mm_movehdup_ps(m4)));
    const float sum = hsum(sum8);
    const __m256 inv = _mm256_set1_ps(top > 0.f ? 32767.0f / top : 0.f);
    // round to nearest even (the default mode), as nearbyint does; pack's lanes put back in order
    for (int i = 0; i < 4; i += 2) {
      const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
      const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(v[i + 1], inv));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + 8 * i),
                          _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
    }
#else
    float top = 0.f, sum = 0.f;
    for (int j = 0; j < QBLOCK; ++j) {
      top = std::max(top, std::fabs(xb[j]));
      sum += xb[j];
    }
    const float inv = top > 0.f ? 32767.0f / top : 0.f;
    for (int j = 0; j < QBLOCK; ++j) qb[j] = int16_t(std::nearbyint(xb[j] * inv));
#endif
    xscale[tb] = top / 32767.0f;
    xsum[tb] = sum;
  }
}

// A block-quantized weight [rows, cols] and its bias (kernels/cpu_kernels.py's BlockWeight): q holds a
// row's blocks back to back; scale, zero: [rows, cols / 32]; zero and bias may be null.
struct BlockMatrix {
  const uint8_t* q;
  const float* scale;
  const float* zero;
  const float* bias;
  int64_t rows, cols, bits;  // bits: 4 (Q4) or 8 (Q8)
};

// Rows a tile asks the memory for ahead of reading them: the hardware prefetcher alone left the
// 8-bit LM head (576 bytes a row) waiting on memory, at ~2.5x the time a block takes with this
// (a one-off C++ loop over a 49152 x 576 Q8 weight; in the engine the LM head went from ~2.0 to
// ~1.1-1.5 ms a step, bench/decode_floor.py's "linear layers + LM head" from 8.3 to 5.0 ms)
constexpr int64_t PREFETCH_ROWS = 8;

// out [n, rows] = x [n, cols] times the weight^T (+ bias), from x as quantize_blocks leaves it.
// Called by every thread of a team (orphaned worksharing loops; the last ends in a barrier).
template <class K>
void block_matmul_team(const BlockMatrix& m, int64_t n, const int16_t* xq, const float* xscale, const float* xsum,
                       float* out) {
  const int64_t nb = m.cols / QBLOCK, rows = m.rows, cols = m.cols;
  // a tile: NR weight rows by NT activation rows, each widened block used NR * NT times. Two
  // weight rows at a time for one or two activation rows (a row's end costs a mispredicted
  // branch and a reduction: at 18 blocks a row, as much as a few blocks' work)
  const auto run = [&](int64_t r, int64_t t0, auto tile_fn, auto nr_c, auto nt_c) __attribute__((always_inline)) {
    constexpr int NR = decltype(nr_c)::value, NT = decltype(nt_c)::value;
    float d[NR][NT];
    if (t0 == 0 && r + PREFETCH_ROWS + NR <= rows) {
      const char* ahead = reinterpret_cast<const char*>(m.q + (r + PREFETCH_ROWS) * nb * K::BYTES);
      for (int64_t o = 0; o < NR * nb * K::BYTES; o += 64) __builtin_prefetch(ahead + o, 0, 3);
    }
    tile_fn(m.q + r * nb * K::BYTES, m.scale + r * nb, nb, xq + t0 * cols, xscale + t0 * nb, cols, d);
    for (int i = 0; i < NR; ++i)
      for (int t = 0; t < NT; ++t) {
        float z = 0.f;
        if (m.zero != nullptr) {
          const float* zr = m.zero + (r + i) * nb;
          const float* xs = xsum + (t0 + t) * nb;
#pragma omp simd reduction(+ : z)
          for (int64_t b = 0; b < nb; ++b) z += zr[b] * xs[b];
        }
        float y = d[i][t] + z;
        if (m.bias != nullptr) y += m.bias[r + i];  // after the sum, as a separate bias add rounds
        out[(t0 + t) * rows + r + i] = y;
      }
  };
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using I3 = std::integral_constant<int, 3>;
  using I4 = std::integral_constant<int, 4>;
  const int64_t pairs = n == 1 || n == 2 ? rows / 2 : 0;
#pragma omp for schedule(static) nowait
  for (int64_t p = 0; p < pairs; ++p) {
    if (n == 1) run(2 * p, 0, tile<K, 2, 1>, I2{}, I1{});
    else run(2 * p, 0, tile<K, 2, 2>, I2{}, I2{});
  }
#pragma omp for schedule(static)
  for (int64_t r = 2 * pairs; r < rows; ++r)
    for (int64_t t0 = 0; t0 < n; t0 += 4) switch (std::min<int64_t>(4, n - t0)) {
        case 1: run(r, t0, tile<K, 1, 1>, I1{}, I1{}); break;
        case 2: run(r, t0, tile<K, 1, 2>, I1{}, I2{}); break;
        case 3: run(r, t0, tile<K, 1, 3>, I1{}, I3{}); break;
        default: run(r, t0, tile<K, 1, 4>, I1{}, I4{}); break;
      }
}

inline void matmul_team(const BlockMatrix& m, int64_t n, const int16_t* xq, const float* xscale, const float* xsum,
                        float* out) {
  if (m.bits == 4) block_matmul_team<Q4>(m, n, xq, xscale, xsum, out);
  else block_matmul_team<Q8>(m, n, xq, xscale, xsum, out);
}

// Activation scratch of n rows of up to `cols` values: int16 values, then block scales and sums
struct QuantizedRows {
  int16_t* xq;
  float* xscale;
  float* xsum;
  QuantizedRows(int64_t n, int64_t cols) {
    const int64_t nb = cols / QBLOCK;
    xq = static_cast<int16_t*>(std::malloc(sizeof(int16_t) * n * cols + sizeof(float) * 2 * n * nb + 64));
    xscale = reinterpret_cast<float*>(xq + n * cols + 32);
    xsum = xscale + n * nb;
  }
  ~QuantizedRows() { std::free(xq); }
  QuantizedRows(const QuantizedRows&) = delete;
  QuantizedRows& operator=(const QuantizedRows&) = delete;
};

// out [n, rows] = x [n, cols] (float32, contiguous) times the block-quantized weight^T (+ bias)
void block_linear(const BlockMatrix& m, const float* x, int64_t n, float* out) {
  if (n == 0) return;
  QuantizedRows a(n, m.cols);
  quantize_blocks(x, n * (m.cols / QBLOCK), a.xq, a.xscale, a.xsum);
#pragma omp parallel
  matmul_team(m, n, a.xq, a.xscale, a.xsum, out);
}

// ---- one decoder layer of a pure-decode step ------------------------------------------------------
// A float32 model whose four linear layers are block-quantized (runtime/models/fused_decode.py):
// norm -> qkv -> RoPE -> K/V write -> attention -> o -> norm -> gate-up -> SiLU -> down in one call
// and one OpenMP team, instead of ~10 calls from Python, each returning to the interpreter (~9 us
// a call, ~300 a step). Each stage is the separate kernels' own code: the results are identical.
struct LayerWeights {
  BlockMatrix qkv, o, gate_up, down;
  const float* input_norm;
  const float* post_norm;
  float eps;
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
  const auto quantize = [&](const float* x, int64_t r, int64_t cols) {
    const int64_t nb = cols / QBLOCK;
    quantize_blocks(x + r * cols, nb, a.xq + r * cols, a.xscale + r * nb, a.xsum + r * nb);
  };
#pragma omp parallel
  {
#pragma omp for
    for (int64_t r = 0; r < n; ++r) {
      add_rms_norm_row<float>(s.x + r * hidden, has_delta ? s.delta + r * hidden : nullptr, w.input_norm,
                              h + r * hidden, hidden, w.eps);
      quantize(h, r, hidden);
    }
    matmul_team(w.qkv, n, a.xq, a.xscale, a.xsum, qkv);
#pragma omp for
    for (int64_t r = 0; r < n; ++r) {
      float* row = qkv + r * qkv_width;  // [q heads | k heads | v heads]
      rope_row<float>(row, heads + p.kv_heads, d, s.cos + s.positions[r] * d, s.sin + s.positions[r] * d);
      std::memcpy(k_cache + s.out_slots[r] * kv_width, row + q_width, kv_width * sizeof(float));
      std::memcpy(v_cache + s.out_slots[r] * kv_width, row + q_width + kv_width, kv_width * sizeof(float));
    }
    decode_attention_team<float>(p, layer, qkv, qkv_width, n, att);
#pragma omp for
    for (int64_t r = 0; r < n; ++r) quantize(att, r, q_width);
    matmul_team(w.o, n, a.xq, a.xscale, a.xsum, o);
#pragma omp for
    for (int64_t r = 0; r < n; ++r) {
      add_rms_norm_row<float>(s.x + r * hidden, o + r * hidden, w.post_norm, h + r * hidden, hidden, w.eps);
      quantize(h, r, hidden);
    }
    matmul_team(w.gate_up, n, a.xq, a.xscale, a.xsum, gate_up);
    // by blocks, not rows: at one token a row is one thread's work
#pragma omp for
    for (int64_t rb = 0; rb < n * (inter / QBLOCK); ++rb) {
      const int64_t r = rb / (inter / QBLOCK), c = rb % (inter / QBLOCK) * QBLOCK;
      silu_mul_row<float>(gate_up + r * 2 * inter + c, gate_up + r * 2 * inter + inter + c, act + r * inter + c,
                          QBLOCK);
      quantize_blocks(act + r * inter + c, 1, a.xq + r * inter + c, a.xscale + rb, a.xsum + rb);
    }
    matmul_team(w.down, n, a.xq, a.xscale, a.xsum, s.delta);
  }
  std::free(h);
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
                                            int64_t rows, void* out) {                                          \
    _Pragma("omp parallel") decode_attention_team<T>(*p, layer, static_cast<const T*>(q), q_stride, rows,       \
                                                     static_cast<T*>(out));                                     \
  }
RS_BOTH(RS_DECODE_ATTENTION)

RS_EXPORT void rs_block_linear(const BlockMatrix* m, const float* x, int64_t n, float* out) {
  block_linear(*m, x, n, out);
}

RS_EXPORT void rs_decoder_layer(const LayerWeights* w, const DecodeStep* s, int64_t layer, int64_t has_delta) {
  decoder_layer(*w, *s, layer, has_delta != 0);
}
