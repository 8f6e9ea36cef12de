// CPU kernels of the decode step, compiled for the machine's own CPU on first use
// (kernels/cpu_kernels.py: g++ -O3 -march=native -fopenmp). Plain C entry points over raw pointers,
// called through ctypes: no torch headers, so a build takes seconds.
//
// Each layer-step kernel does in one call what takes the torch path several ATen ops, and rounds
// where the torch ops it replaces round (results in the model's dtype after each of them), so that
// both paths agree to float rounding. The linear layers on block-quantized weights have no torch
// counterpart: their rounding is their own (see there). Threads: OpenMP, which resolves to the libgomp torch has loaded, i.e.
// the calling thread's own team (a second OpenMP runtime would halve decode speed here).
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

// x[r] += delta[r] (when delta is given; the float32 residual stream), then
// out[r] = T(x[r] / sqrt(mean(x[r]^2) + eps) * w)
template <class T>
void add_rms_norm(float* x, const T* delta, int64_t delta_stride, const float* w, T* out, int64_t rows,
                  int64_t d, float eps) {
#pragma omp parallel for if (rows >= 16)
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * d;
    if (delta != nullptr) {
      const T* dr = delta + r * delta_stride;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) xr[i] += to_f(dr[i]);
    }
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / float(d) + eps);
    T* o = out + r * d;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) o[i] = from_f<T>(xr[i] * inv * w[i]);
  }
}

// Rotary embedding in place on the first `heads` heads of each row (rotate-half layout), with the
// tables of runtime/models/rope.py: cos twice, then -sin and sin, rows picked by position.
template <class T>
void rope(T* x, int64_t row_stride, int64_t rows, int64_t heads, int64_t d, const T* cos, const T* sin,
          const int64_t* positions) {
  const int64_t half = d / 2;
#pragma omp parallel for if (rows >= 16)
  for (int64_t r = 0; r < rows; ++r) {
    const T* c = cos + positions[r] * d;
    const T* s = sin + positions[r] * d;
    float buf[512];
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + r * row_stride + h * d;
      for (int64_t i = 0; i < d; ++i) buf[i] = to_f(v[i]);
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) {
        const float rolled = buf[i < half ? i + half : i - half];
        // x * cos rounds to T before the add, as torch.addcmul(x * cos, roll(x), sin) does
        v[i] = from_f<T>(to_f(from_f<T>(buf[i] * to_f(c[i]))) + rolled * to_f(s[i]));
      }
    }
  }
}

// out[r] = T(T(silu(gate[r])) * up[r]) for rows [gate | up] of width 2 * inter
template <class T>
void silu_mul(const T* gate_up, int64_t rows, int64_t inter, T* out) {
#pragma omp parallel for if (rows >= 16)
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = gate_up + r * 2 * inter;
    const T* u = g + inter;
    T* o = out + r * inter;
#pragma omp simd
    for (int64_t i = 0; i < inter; ++i) {
      const float a = to_f(g[i]);
      const T silu = from_f<T>(a / (1.0f + exp2_fast(-a * LOG2_E)));
      o[i] = from_f<T>(to_f(silu) * to_f(u[i]));
    }
  }
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

// Decode attention read straight from the KV pages, planned by runtime/attention_cpu.py:
// - an item scores the queries of its members (one for a request's own tokens; every member of a
//   group for a cached prefix they share, so those pages are read once for all of them) against
//   the tokens [start, end) of page-table row `page_row`, and leaves per member and head the
//   unnormalised sum of weighted values, the max score and the sum of weights (base 2) in the
//   member's partial slot (slot i for member i): items = [n_items, 5] (page_row, start, end,
//   first member, members), members = the query row of each member;
// - then each query row merges its slots (slots[slot_start[b] .. slot_start[b + 1]]) by their
//   maxima into out[b].
// Caches: [slots, kv_heads, d] of one layer; partials: [n_slots, heads, d + 2] float32.
template <class T>
void decode_attention(const T* q, int64_t q_stride, T* out, const T* k_cache, const T* v_cache,
                      const int64_t* table, int64_t table_stride, int64_t page_size, const int32_t* items,
                      int64_t n_items, const int32_t* members, const int32_t* slot_start, const int32_t* slots,
                      int64_t rows, float* partials, int64_t heads, int64_t kv_heads, int64_t d, float scale,
                      int64_t max_members, int64_t max_scores) {
  const int64_t group = heads / kv_heads, width = kv_heads * d, pw = d + 2;
  const float scale2 = scale * LOG2_E;
  int64_t max_tokens = 0;
  for (int64_t it = 0; it < n_items; ++it) max_tokens = std::max<int64_t>(max_tokens, items[it * 5 + 2] - items[it * 5 + 1]);
#pragma omp parallel if (n_items > 1)
  {
    float* scores = static_cast<float*>(std::malloc(sizeof(float) * (max_scores + max_members * heads * d)));
    float* qf = scores + max_scores;
    const T** k_rows = static_cast<const T**>(std::malloc(sizeof(T*) * 2 * (max_tokens + 1)));
    const T** v_rows = k_rows + max_tokens + 1;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const int32_t* item = items + it * 5;
      const int64_t* pages = table + int64_t(item[0]) * table_stride;
      const int64_t start = item[1], end = item[2], n = end - start, m0 = item[3], nm = item[4];
      for (int64_t m = 0; m < nm; ++m) {
        const T* qm = q + int64_t(members[m0 + m]) * q_stride;
        for (int64_t i = 0; i < heads * d; ++i) qf[m * heads * d + i] = to_f(qm[i]) * scale2;
      }
      for (int64_t g = 0; g < kv_heads; ++g) {
        for (int64_t j = 0; j < n; ++j) {
          const int64_t t = start + j, slot = pages[t / page_size] * page_size + t % page_size;
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
            parts[i] = partials + ((m0 + m) * heads + h) * pw;
          }
          tile_scores(qt, qs, k_rows, n, d, ss);
          for (int64_t i = 0; i < qt; ++i) softmax_weights(ss[i], n, parts[i] + d, parts[i] + d + 1);
          tile_values(qt, const_cast<const float* const*>(ss), v_rows, n, d, parts);
        }
      }
    }
    std::free(k_rows);
    std::free(scores);
  }
#pragma omp parallel for if (rows * heads >= 64)
  for (int64_t bh = 0; bh < rows * heads; ++bh) {
    const int64_t b = bh / heads, h = bh % heads;
    float top = -INFINITY;
    for (int32_t j = slot_start[b]; j < slot_start[b + 1]; ++j) top = std::max(top, partials[(slots[j] * heads + h) * pw + d]);
    float acc[512] = {0.f};
    float sum = 0.f;
    for (int32_t j = slot_start[b]; j < slot_start[b + 1]; ++j) {
      const float* part = partials + (int64_t(slots[j]) * heads + h) * pw;
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

// out [n, rows] = x [n, cols] (float32, contiguous) times the block-quantized weight [rows, cols]
// (q: a row's blocks back to back; scale, zero: [rows, cols / 32]; zero may be null)
template <class K>
void block_linear(const float* x, int64_t n, int64_t cols, const uint8_t* q, const float* scale,
                  const float* zero, int64_t rows, float* out) {
  if (n == 0) return;
  const int64_t nb = cols / QBLOCK;
  int16_t* xq = static_cast<int16_t*>(std::malloc(sizeof(int16_t) * n * cols + sizeof(float) * 2 * n * nb + 64));
  float* xscale = reinterpret_cast<float*>(xq + n * cols + 32);
  float* xsum = xscale + n * nb;
  for (int64_t tb = 0; tb < n * nb; ++tb) {
    const float* xb = x + tb * QBLOCK;
    float top = 0.f, sum = 0.f;
    for (int j = 0; j < QBLOCK; ++j) {
      top = std::max(top, std::fabs(xb[j]));
      sum += xb[j];
    }
    const float inv = top > 0.f ? 32767.0f / top : 0.f;
    for (int j = 0; j < QBLOCK; ++j) xq[tb * QBLOCK + j] = int16_t(std::nearbyint(xb[j] * inv));
    xscale[tb] = top / 32767.0f;
    xsum[tb] = sum;
  }
  // a tile: NR weight rows by NT activation rows, each widened block used NR * NT times. Two
  // weight rows at a time for one or two activation rows (a row's end costs a mispredicted
  // branch and a reduction: at 18 blocks a row, as much as a few blocks' work)
  const auto run = [&](int64_t r, int64_t t0, auto tile_fn, auto nr_c, auto nt_c) __attribute__((always_inline)) {
    constexpr int NR = decltype(nr_c)::value, NT = decltype(nt_c)::value;
    float d[NR][NT];
    tile_fn(q + r * nb * K::BYTES, scale + r * nb, nb, xq + t0 * cols, xscale + t0 * nb, cols, d);
    for (int i = 0; i < NR; ++i)
      for (int t = 0; t < NT; ++t) {
        float z = 0.f;
        if (zero != nullptr) {
          const float* zr = zero + (r + i) * nb;
          const float* xs = xsum + (t0 + t) * nb;
#pragma omp simd reduction(+ : z)
          for (int64_t b = 0; b < nb; ++b) z += zr[b] * xs[b];
        }
        out[(t0 + t) * rows + r + i] = d[i][t] + z;
      }
  };
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using I3 = std::integral_constant<int, 3>;
  using I4 = std::integral_constant<int, 4>;
  const int64_t pairs = n == 1 || n == 2 ? rows / 2 : 0;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pairs; ++p) {
    if (n == 1) run(2 * p, 0, tile<K, 2, 1>, I2{}, I1{});
    else run(2 * p, 0, tile<K, 2, 2>, I2{}, I2{});
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 2 * pairs; r < rows; ++r)
    for (int64_t t0 = 0; t0 < n; t0 += 4) switch (std::min<int64_t>(4, n - t0)) {
        case 1: run(r, t0, tile<K, 1, 1>, I1{}, I1{}); break;
        case 2: run(r, t0, tile<K, 1, 2>, I1{}, I2{}); break;
        case 3: run(r, t0, tile<K, 1, 3>, I1{}, I3{}); break;
        default: run(r, t0, tile<K, 1, 4>, I1{}, I4{}); break;
      }
  std::free(xq);
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
  RS_EXPORT void rs_decode_attention_##NAME(                                                                  \
      const void* q, int64_t q_stride, void* out, const void* k_cache, const void* v_cache,                   \
      const int64_t* table, int64_t table_stride, int64_t page_size, const int32_t* items, int64_t n_items,   \
      const int32_t* members, const int32_t* slot_start, const int32_t* slots, int64_t rows, float* partials,  \
      int64_t heads, int64_t kv_heads, int64_t d, float scale, int64_t max_members, int64_t max_scores) {     \
    decode_attention<T>(static_cast<const T*>(q), q_stride, static_cast<T*>(out), static_cast<const T*>(k_cache), \
                        static_cast<const T*>(v_cache), table, table_stride, page_size, items, n_items, members, \
                        slot_start, slots, rows, partials, heads, kv_heads, d, scale, max_members, max_scores); \
  }
RS_BOTH(RS_DECODE_ATTENTION)

RS_EXPORT void rs_q4_linear(const float* x, int64_t n, int64_t cols, const uint8_t* q, const float* scale,
                            const float* zero, int64_t rows, float* out) {
  block_linear<Q4>(x, n, cols, q, scale, zero, rows, out);
}
RS_EXPORT void rs_q8_linear(const float* x, int64_t n, int64_t cols, const uint8_t* q, const float* scale,
                            const float* zero, int64_t rows, float* out) {
  block_linear<Q8>(x, n, cols, q, scale, zero, rows, out);
}
