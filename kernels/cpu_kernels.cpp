// CPU kernels of the decode step, compiled for the machine's own CPU on first use
// (kernels/cpu_kernels.py: g++ -O3 -march=native -fopenmp). Plain C entry points over raw pointers,
// called through ctypes: no torch headers, so a build takes about a second.
//
// Each kernel does in one call what takes the torch path several ATen ops, and rounds where the
// torch ops it replaces round (results in the model's dtype after each of them), so that both paths
// agree to float rounding. Threads: OpenMP, which resolves to the libgomp torch has loaded, i.e.
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

inline float dot(const float* a, const float* b, int64_t d) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < d; ++i) s = std::fma(a[i], b[i], s);
  return s;
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
#pragma omp parallel if (n_items > 1)
  {
    float* scores = static_cast<float*>(std::malloc(sizeof(float) * (max_scores + max_members * heads * d + d)));
    float* qf = scores + max_scores;
    float* row = qf + max_members * heads * d;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const int32_t* item = items + it * 5;
      const int64_t* pages = table + int64_t(item[0]) * table_stride;
      const int64_t start = item[1], end = item[2], n = end - start, m0 = item[3], nm = item[4];
      for (int64_t m = 0; m < nm; ++m) {
        const T* qm = q + int64_t(members[m0 + m]) * q_stride;
        for (int64_t i = 0; i < heads * d; ++i) qf[m * heads * d + i] = to_f(qm[i]);
      }
      for (int64_t t = start; t < end; ++t) {
        const T* kt = k_cache + (pages[t / page_size] * page_size + t % page_size) * width;
        for (int64_t g = 0; g < kv_heads; ++g) {
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) row[i] = to_f(kt[g * d + i]);
          for (int64_t m = 0; m < nm; ++m)
            for (int64_t h = g * group; h < (g + 1) * group; ++h)
              scores[(m * heads + h) * n + (t - start)] = dot(qf + (m * heads + h) * d, row, d) * scale2;
        }
      }
      for (int64_t mh = 0; mh < nm * heads; ++mh) {
        float* s = scores + mh * n;
        float top = s[0];
        for (int64_t t = 1; t < n; ++t) top = std::max(top, s[t]);
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < n; ++t) {
          s[t] = exp2_fast(s[t] - top);
          sum += s[t];
        }
        float* part = partials + ((m0 + mh / heads) * heads + mh % heads) * pw;
        std::fill(part, part + d, 0.f);
        part[d] = top;
        part[d + 1] = sum;
      }
      for (int64_t t = start; t < end; ++t) {
        const T* vt = v_cache + (pages[t / page_size] * page_size + t % page_size) * width;
        for (int64_t g = 0; g < kv_heads; ++g) {
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) row[i] = to_f(vt[g * d + i]);
          for (int64_t m = 0; m < nm; ++m) {
            float* base = partials + (m0 + m) * heads * pw;
            for (int64_t h = g * group; h < (g + 1) * group; ++h) {
              const float p = scores[(m * heads + h) * n + (t - start)];
              float* acc = base + h * pw;
#pragma omp simd
              for (int64_t i = 0; i < d; ++i) acc[i] = std::fma(p, row[i], acc[i]);
            }
          }
        }
      }
    }
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
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
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
  const int64_t pairs = n <= 2 ? rows / 2 : 0;
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
