/* SparkRing ring transport: the wire format and the element-wise reductions shared by the
 * tcp engine (sr_engine.c) and the verbs engine (sr_verbs.c). transport/wire.py mirrors the
 * header layout for tests; keep the two in step (SR_WIRE_VERSION guards it on the wire). */
#ifndef SR_WIRE_H
#define SR_WIRE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "sr_status.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#define SR_FRAME_MAGIC 0x31465253u /* "SRF1" little-endian */
#define SR_WIRE_VERSION 3 /* 2: the eight-lane payload checksum; 3: heartbeats and dead-peer verdicts */
#define SR_KIND_DATA 1
#define SR_KIND_ACK 2
#define SR_KIND_HEARTBEAT 3 /* "still here": header only, on the ack direction, when nothing else went */
#define SR_KIND_DEAD 4      /* a dead-peer verdict (sr_dead payload), on the ack direction */
#define SR_KIND_BYE 5       /* "closing on purpose": a clean close is no verdict (header only) */
#define SR_HEADER_BYTES 32

/* Little-endian on every supported node (x86_64, aarch64). */
typedef struct __attribute__((packed)) sr_header {
    uint32_t magic;
    uint8_t kind;
    uint8_t flags;
    uint16_t version;
    uint16_t src_rank;
    uint16_t dst_rank;
    uint64_t seq;      /* DATA: the frame's sequence; ACK: frames consumed so far */
    uint32_t length;   /* payload bytes */
    uint32_t payload_sum;
    uint32_t header_sum; /* over the 28 bytes before it */
} sr_header;

_Static_assert(sizeof(sr_header) == SR_HEADER_BYTES, "sr_header must be 32 bytes");

/* The payload of a DEAD frame: which rank failed, on which cable, when, and who saw it first.
 * A rank that sees a neighbour die tells its other neighbours before it closes, and each
 * forwards the first verdict it gets, so every rank names the rank that failed. */
typedef struct __attribute__((packed)) sr_dead {
    uint16_t dead_rank;
    uint16_t reporter;  /* the rank that saw it first-hand (the cable's other end) */
    uint16_t cage;      /* the cable's cage (the same on both ends) */
    uint16_t code;      /* SR_ETIMEOUT (nothing heard) or SR_ECLOSED (its connection closed) */
    uint32_t addr;      /* the dead rank's IPv4 address on that cable, network order (0: unknown) */
    uint32_t silent_ms; /* how long nothing had come from it (timeouts) */
    uint64_t at_ms;     /* when the reporter saw it, UTC milliseconds since the epoch */
} sr_dead;

#define SR_DEAD_BYTES 24
_Static_assert(sizeof(sr_dead) == SR_DEAD_BYTES, "sr_dead must be 24 bytes");

enum sr_op { SR_OP_COPY = 0, SR_OP_ADD = 1 };
enum sr_dtype { SR_F32 = 0, SR_F16 = 1, SR_BF16 = 2 };

typedef struct sr_error {
    int code;
    int peer_rank;
    char message[240];
} sr_error;

/* Fill `err` (when given) and return -code: every failure path of both engines ends here. */
__attribute__((format(printf, 4, 5))) static inline int sr_fail(sr_error *err, int code, int peer,
                                                                 const char *fmt, ...) {
    if (err) {
        va_list ap;
        err->code = code;
        err->peer_rank = peer;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return -code;
}

/* One lane of a transfer: send sbuf[slen] to `to` while receiving rbuf[rlen] from `from`
 * (an engine's peer handle, sr_peer or sr_vlink; either may be NULL). A call runs up to
 * SR_MAX_LANES lanes at once; lanes that share a peer use it in lane order. */
typedef struct sr_lane {
    void *to;
    const void *sbuf;
    size_t slen;
    void *from;
    void *rbuf;
    size_t rlen;
} sr_lane;

#define SR_MAX_LANES 4

#if defined(__x86_64__)
/* AVX2 (and F16C for the fp16 adds) are picked at run time: every x86-64 server since 2013. */
static inline int sr_have_avx2(void) {
    static int have = -1;
    if (have < 0)
        have = __builtin_cpu_supports("avx2");
    return have;
}

static inline int sr_have_avx2_f16c(void) {
    static int have = -1;
    if (have < 0)
        have = sr_have_avx2() && __builtin_cpu_supports("f16c");
    return have;
}
#endif

/* Multiply-rotate: a bijection of h for each w, so any change to one word changes the result. */
static inline uint64_t sr_mix(uint64_t h, uint64_t w) {
    h ^= w * 0x9E3779B97F4A7C15ull;
    h = (h << 31) | (h >> 33);
    return h * 0xC2B2AE3D27D4EB4Full;
}

/* The checksum (wire version 2) reads 64-byte stripes in eight 64-bit lanes. Each lane adds
 * every word it reads (so any change to a word moves its lane's sum) and the product of the
 * two halves of the word xor a key that differs per lane and per stripe (so moving a word
 * changes the result too); the lanes are folded by sr_mix at the end. The lanes are
 * independent and each takes one 32x32->64 multiply per word, so the loop vectorises: about
 * 39 GB/s on one core with AVX2 here, where version 1's chain of two dependent 64-bit
 * multiplies per word ran at 11.5 and capped the engine's threads. */
#define SR_SUM_LANES 8
#define SR_SUM_STEP 0x9E3779B97F4A7C15ull /* the key moves on by this per stripe */
static const uint64_t SR_SUM_KEYS[SR_SUM_LANES] __attribute__((aligned(32))) = {
    0x243F6A8885A308D3ull, 0x13198A2E03707344ull, 0xA4093822299F31D0ull, 0x082EFA98EC4E6C89ull,
    0x452821E638D01377ull, 0xBE5466CF34E90C6Cull, 0xC0AC29B7C97C50DDull, 0x3F84D5B5B5470917ull};

static inline void sr_sum_stripes(uint64_t *restrict acc, uint64_t *restrict sum, const unsigned char *p,
                                  size_t stripes, uint64_t key) {
    for (size_t s = 0; s < stripes; s++, key += SR_SUM_STEP)
        for (int j = 0; j < SR_SUM_LANES; j++) {
            uint64_t w;
            memcpy(&w, p + 64 * s + 8 * j, 8);
            uint64_t x = w ^ (key + SR_SUM_KEYS[j]);
            acc[j] += (uint64_t)(uint32_t)x * (uint64_t)(uint32_t)(x >> 32);
            sum[j] += w;
        }
}

#if defined(__x86_64__)
/* sr_sum_stripes four lanes to a register (the same values). */
__attribute__((target("avx2"))) static inline void sr_sum_stripes_avx2(uint64_t *restrict acc, uint64_t *restrict sum,
                                                                       const unsigned char *p, size_t stripes,
                                                                       uint64_t key) {
    __m256i a0 = _mm256_loadu_si256((const __m256i *)acc), a1 = _mm256_loadu_si256((const __m256i *)(acc + 4));
    __m256i s0 = _mm256_loadu_si256((const __m256i *)sum), s1 = _mm256_loadu_si256((const __m256i *)(sum + 4));
    const __m256i k0 = _mm256_load_si256((const __m256i *)SR_SUM_KEYS);
    const __m256i k1 = _mm256_load_si256((const __m256i *)(SR_SUM_KEYS + 4));
    const __m256i step = _mm256_set1_epi64x((long long)SR_SUM_STEP);
    __m256i k = _mm256_set1_epi64x((long long)key);
    for (size_t s = 0; s < stripes; s++, p += 64) {
        __m256i w0 = _mm256_loadu_si256((const __m256i *)p), w1 = _mm256_loadu_si256((const __m256i *)(p + 32));
        __m256i x0 = _mm256_xor_si256(w0, _mm256_add_epi64(k, k0)), x1 = _mm256_xor_si256(w1, _mm256_add_epi64(k, k1));
        a0 = _mm256_add_epi64(a0, _mm256_mul_epu32(x0, _mm256_srli_epi64(x0, 32)));
        a1 = _mm256_add_epi64(a1, _mm256_mul_epu32(x1, _mm256_srli_epi64(x1, 32)));
        s0 = _mm256_add_epi64(s0, w0);
        s1 = _mm256_add_epi64(s1, w1);
        k = _mm256_add_epi64(k, step);
    }
    _mm256_storeu_si256((__m256i *)acc, a0);
    _mm256_storeu_si256((__m256i *)(acc + 4), a1);
    _mm256_storeu_si256((__m256i *)sum, s0);
    _mm256_storeu_si256((__m256i *)(sum + 4), s1);
}
#endif

/* The checksum of data[len]; `vector` 0 takes the portable loop (the tests compare both). */
static inline uint32_t sr_checksum_with(const void *data, size_t len, int vector) {
    const unsigned char *p = (const unsigned char *)data;
    uint64_t acc[SR_SUM_LANES], sum[SR_SUM_LANES] = {0};
    memcpy(acc, SR_SUM_KEYS, sizeof acc);
    size_t stripes = len / 64;
#if defined(__x86_64__)
    if (vector && sr_have_avx2())
        sr_sum_stripes_avx2(acc, sum, p, stripes, 0);
    else
#endif
        sr_sum_stripes(acc, sum, p, stripes, 0);
    (void)vector;
    if (len % 64) { /* the tail as a stripe padded with zeros; the length below tells them apart */
        unsigned char last[64] = {0};
        memcpy(last, p + 64 * stripes, len % 64);
        sr_sum_stripes(acc, sum, last, 1, stripes * SR_SUM_STEP);
    }
    uint64_t h = (uint64_t)len * 0xC2B2AE3D27D4EB4Full;
    for (int j = 0; j < SR_SUM_LANES; j++)
        h = sr_mix(sr_mix(h, acc[j]), sum[j]);
    return (uint32_t)(h ^ (h >> 32));
}

static inline uint32_t sr_checksum_bytes(const void *data, size_t len) { return sr_checksum_with(data, len, 1); }

static inline void sr_header_fill(sr_header *h, uint8_t kind, uint16_t src, uint16_t dst, uint64_t seq,
                                  const void *payload, uint32_t length) {
    h->magic = SR_FRAME_MAGIC;
    h->kind = kind;
    h->flags = 0;
    h->version = SR_WIRE_VERSION;
    h->src_rank = src;
    h->dst_rank = dst;
    h->seq = seq;
    h->length = length;
    h->payload_sum = length ? sr_checksum_bytes(payload, length) : 0;
    h->header_sum = sr_checksum_bytes(h, SR_HEADER_BYTES - 4);
}

/* fp16/bf16 <-> fp32 by bits, round to nearest even: identical to numpy's (fp16) and torch's (bf16)
 * astype, NaN payloads included. Branch-free, so the reductions below vectorise. */
static inline uint32_t sr_bits_of(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

static inline float sr_float_of(uint32_t x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* All ones where `cond` holds: selects by mask keep the loops free of branches. */
static inline uint32_t sr_mask(int cond) { return 0u - (uint32_t)cond; }

static inline uint32_t sr_pick(uint32_t mask, uint32_t yes, uint32_t no) { return (yes & mask) | (no & ~mask); }

static inline float sr_f16_to_f32(uint16_t h) {
    uint32_t em = (uint32_t)(h & 0x7FFFu) << 13, exp = em & 0x0F800000u;
    uint32_t normal = em + 0x38000000u;      /* rebias the exponent: (127 - 15) << 23 */
    uint32_t special = normal + 0x38000000u; /* inf/NaN: the exponent all ones, payload kept */
    /* subnormal: 2^-14 x (1 + m/1024) - 2^-14 = m x 2^-24, exact in fp32 */
    uint32_t sub = sr_bits_of(sr_float_of(normal + 0x00800000u) - 0x1p-14f);
    uint32_t bits = sr_pick(sr_mask(exp == 0x0F800000u), special, sr_pick(sr_mask(exp == 0), sub, normal));
    return sr_float_of(bits | (uint32_t)(h & 0x8000u) << 16);
}

static inline uint16_t sr_f32_to_f16(float f) {
    uint32_t x = sr_bits_of(f), a = x & 0x7FFFFFFFu, top = (a >> 13) & 0x3FFu;
    /* normal: rebias ((15 - 127) << 23), round to nearest even at bit 13; may carry up to inf */
    uint32_t normal = (a + 0xC8000FFFu + (top & 1u)) >> 13;
    /* below 2^-14: adding 0.5 makes the fp32 adder round the 10 bits we keep to nearest even */
    uint32_t sub = sr_bits_of(sr_float_of(a) + 0.5f) - 0x3F000000u;
    /* NaN keeps its top payload bits (never an empty payload, which would read as inf) */
    uint32_t nan = 0x7C00u | top | (sr_mask((a & 0x1FFFu) != 0) & sr_mask(top == 0) & 1u);
    uint32_t r = sr_pick(sr_mask(a < 0x38800000u), sub, normal);
    r = sr_pick(sr_mask(a >= 0x47800000u), 0x7C00u, r);
    r = sr_pick(sr_mask(a > 0x7F800000u), nan, r);
    return (uint16_t)((x >> 16 & 0x8000u) | r);
}

static inline float sr_bf16_to_f32(uint16_t h) { return sr_float_of((uint32_t)h << 16); }

static inline uint16_t sr_f32_to_bf16(float f) {
    uint32_t x = sr_bits_of(f);
    uint32_t quiet = (x >> 16) | 0x40u; /* NaN: quiet, as torch does */
    uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    return (uint16_t)sr_pick(sr_mask((x & 0x7FFFFFFFu) > 0x7F800000u), quiet, rounded);
}

/* The NaN an add makes of inf + -inf: x86's "indefinite". Arm writes 0x7FC00000 there, so the
 * aarch64 paths write this one instead and every CPU gives the same bytes. */
#define SR_NAN_MADE 0xFFC00000u

/* a + b, except that when both are NaN the result is the one whose quieted bits are larger:
 * hardware returns the first operand's, and the two ends of an exchange add in opposite
 * orders, so they would differ; and a NaN the add makes itself is SR_NAN_MADE. Any other sum
 * is the hardware's. */
static inline float sr_add(float a, float b) {
    uint32_t qa = sr_bits_of(a) | 0x00400000u, qb = sr_bits_of(b) | 0x00400000u;
    float sum = a + b;
    uint32_t both_nan = sr_mask(a != a) & sr_mask(b != b);
    uint32_t made_nan = sr_mask(sum != sum) & sr_mask(a == a) & sr_mask(b == b);
    return sr_float_of(sr_pick(both_nan, qa > qb ? qa : qb, sr_pick(made_nan, SR_NAN_MADE, sr_bits_of(sum))));
}

/* The element loops, written once; inlined into each target below, which compiles them for
 * its vector width. */
__attribute__((always_inline)) static inline void sr_add_f32(float *restrict d, const float *restrict s, size_t n) {
    for (size_t i = 0; i < n; i++)
        d[i] = sr_add(d[i], s[i]);
}

__attribute__((always_inline)) static inline void sr_add_f16(uint16_t *restrict d, const uint16_t *restrict s,
                                                             size_t n) {
    for (size_t i = 0; i < n; i++)
        d[i] = sr_f32_to_f16(sr_add(sr_f16_to_f32(d[i]), sr_f16_to_f32(s[i])));
}

__attribute__((always_inline)) static inline void sr_add_bf16(uint16_t *restrict d, const uint16_t *restrict s,
                                                              size_t n) {
    for (size_t i = 0; i < n; i++)
        d[i] = sr_f32_to_bf16(sr_add(sr_bf16_to_f32(d[i]), sr_bf16_to_f32(s[i])));
}

#if defined(__x86_64__)
/* sr_add eight at a time (x86 hardware makes SR_NAN_MADE itself). */
__attribute__((target("avx2"))) static inline __m256 sr_add8(__m256 a, __m256 b) {
    __m256 sum = _mm256_add_ps(a, b);
    __m256 both_nan = _mm256_and_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    if (_mm256_testz_ps(both_nan, both_nan)) /* the common case: no lane adds two NaNs */
        return sum;
    const __m256i quiet = _mm256_set1_epi32(0x00400000);
    __m256i larger = _mm256_max_epu32(_mm256_or_si256(_mm256_castps_si256(a), quiet),
                                      _mm256_or_si256(_mm256_castps_si256(b), quiet));
    return _mm256_blendv_ps(sum, _mm256_castsi256_ps(larger), both_nan);
}

/* AVX2 + F16C (every x86-64 server since 2013), chosen at run time: the hardware converts
 * fp16 exactly as sr_f16_to_f32/sr_f32_to_f16 do (round to nearest even by the immediate,
 * whatever MXCSR says; NaN payloads kept, quieted). */
__attribute__((target("avx2,f16c"))) static inline void sr_add_f16_f16c(uint16_t *restrict d, const uint16_t *restrict s,
                                                                  size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + i)));
        __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(sr_add8(a, b), _MM_FROUND_TO_NEAREST_INT));
    }
    sr_add_f16(d + i, s + i, n - i);
}

__attribute__((target("avx2"))) static inline void sr_add_f32_avx2(float *restrict d, const float *restrict s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, sr_add8(_mm256_loadu_ps(d + i), _mm256_loadu_ps(s + i)));
    sr_add_f32(d + i, s + i, n - i);
}

/* sr_f32_to_bf16 eight at a time: round to nearest even, or the quieted NaN. */
__attribute__((target("avx2"))) static inline void sr_add_bf16_avx2(uint16_t *restrict d, const uint16_t *restrict s,
                                                              size_t n) {
    const __m256i bias = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
    const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i a = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(d + i))), 16);
        __m256i b = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i))), 16);
        __m256i x = _mm256_castps_si256(sr_add8(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b)));
        __m256i high = _mm256_srli_epi32(x, 16);
        __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, bias), _mm256_and_si256(high, one)), 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, magnitude), inf);
        __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, quiet), nan);
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08); /* 16-bit results in order */
        _mm_storeu_si128((__m128i *)(d + i), _mm256_castsi256_si128(packed));
    }
    sr_add_bf16(d + i, s + i, n - i);
}

#endif

#if defined(__aarch64__)
/* NEON (Advanced SIMD) is part of every ARMv8-A core, fp16 <-> fp32 conversions included, so
 * aarch64 needs no run-time check. The adds are the hardware's, as in the portable loop (the
 * same FPCR: round to nearest even, no flush to zero, NaNs propagated with their payload);
 * nothing here multiplies, so FMA contraction cannot change a result. */

/* sr_add four at a time. */
static inline float32x4_t sr_add4(float32x4_t a, float32x4_t b) {
    float32x4_t sum = vaddq_f32(a, b);
    uint32x4_t sum_ok = vceqq_f32(sum, sum);
    if (vminvq_u32(sum_ok) != 0) /* the common case: no lane is NaN */
        return sum;
    uint32x4_t a_nan = vmvnq_u32(vceqq_f32(a, a)), b_nan = vmvnq_u32(vceqq_f32(b, b));
    uint32x4_t made_nan = vbicq_u32(vbicq_u32(vmvnq_u32(sum_ok), a_nan), b_nan);
    const uint32x4_t quiet = vdupq_n_u32(0x00400000u);
    uint32x4_t larger = vmaxq_u32(vorrq_u32(vreinterpretq_u32_f32(a), quiet), vorrq_u32(vreinterpretq_u32_f32(b), quiet));
    sum = vbslq_f32(made_nan, vreinterpretq_f32_u32(vdupq_n_u32(SR_NAN_MADE)), sum);
    return vbslq_f32(vandq_u32(a_nan, b_nan), vreinterpretq_f32_u32(larger), sum);
}

static inline void sr_add_f32_neon(float *restrict d, const float *restrict s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        vst1q_f32(d + i, sr_add4(vld1q_f32(d + i), vld1q_f32(s + i)));
        vst1q_f32(d + i + 4, sr_add4(vld1q_f32(d + i + 4), vld1q_f32(s + i + 4)));
    }
    sr_add_f32(d + i, s + i, n - i);
}

/* FCVTL/FCVTN convert exactly as sr_f16_to_f32/sr_f32_to_f16 (round to nearest even by
 * FPCR; a NaN keeps its top payload bits and comes out quiet, as every NaN sum already is). */
static inline void sr_add_f16_neon(uint16_t *restrict d, const uint16_t *restrict s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x8_t a = vreinterpretq_f16_u16(vld1q_u16(d + i)), b = vreinterpretq_f16_u16(vld1q_u16(s + i));
        float32x4_t lo = sr_add4(vcvt_f32_f16(vget_low_f16(a)), vcvt_f32_f16(vget_low_f16(b)));
        float32x4_t hi = sr_add4(vcvt_high_f32_f16(a), vcvt_high_f32_f16(b));
        vst1q_u16(d + i, vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(lo), hi)));
    }
    sr_add_f16(d + i, s + i, n - i);
}

/* sr_f32_to_bf16 four at a time, in integers as the portable loop (round to nearest even, or
 * the quieted NaN); the ARMv8.6 BFCVT is not in every aarch64 core. */
static inline uint16x4_t sr_f32x4_to_bf16(float32x4_t f) {
    uint32x4_t x = vreinterpretq_u32_f32(f), high = vshrq_n_u32(x, 16);
    uint32x4_t rounded = vshrq_n_u32(vaddq_u32(vaddq_u32(x, vdupq_n_u32(0x7FFFu)), vandq_u32(high, vdupq_n_u32(1u))), 16);
    uint32x4_t nan = vcgtq_u32(vandq_u32(x, vdupq_n_u32(0x7FFFFFFFu)), vdupq_n_u32(0x7F800000u));
    return vmovn_u32(vbslq_u32(nan, vorrq_u32(high, vdupq_n_u32(0x40u)), rounded));
}

static inline void sr_add_bf16_neon(uint16_t *restrict d, const uint16_t *restrict s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16x8_t a = vld1q_u16(d + i), b = vld1q_u16(s + i);
        float32x4_t lo = sr_add4(vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(a), 16)),
                                 vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(b), 16)));
        float32x4_t hi = sr_add4(vreinterpretq_f32_u32(vshll_high_n_u16(a, 16)),
                                 vreinterpretq_f32_u32(vshll_high_n_u16(b, 16)));
        vst1q_u16(d + i, vcombine_u16(sr_f32x4_to_bf16(lo), sr_f32x4_to_bf16(hi)));
    }
    sr_add_bf16(d + i, s + i, n - i);
}
#endif

/* The portable loops alone: the reference every vector path is held to (the tests compare
 * them byte for byte), and what sr_reduce_add runs on an x86 CPU without AVX2 and F16C. */
static inline void sr_reduce_add_portable(void *restrict dst, const void *restrict src, size_t bytes, int dtype) {
    if (dtype == SR_F32)
        sr_add_f32((float *)dst, (const float *)src, bytes / 4);
    else if (dtype == SR_F16)
        sr_add_f16((uint16_t *)dst, (const uint16_t *)src, bytes / 2);
    else
        sr_add_bf16((uint16_t *)dst, (const uint16_t *)src, bytes / 2);
}

/* dst[i] = dst[i] + src[i]; fp16/bf16 widen to fp32, add, and round back once per call (a
 * collective that adds in several steps rounds after each). The sum is symmetric bit for bit
 * (see sr_add), so both ends of an exchange produce the same bytes. dst and src never overlap. */
static inline void sr_reduce_add(void *restrict dst, const void *restrict src, size_t bytes, int dtype) {
#if defined(__x86_64__)
    if (sr_have_avx2_f16c()) {
        if (dtype == SR_F32)
            sr_add_f32_avx2((float *)dst, (const float *)src, bytes / 4);
        else if (dtype == SR_F16)
            sr_add_f16_f16c((uint16_t *)dst, (const uint16_t *)src, bytes / 2);
        else
            sr_add_bf16_avx2((uint16_t *)dst, (const uint16_t *)src, bytes / 2);
        return;
    }
#elif defined(__aarch64__)
    if (dtype == SR_F32)
        sr_add_f32_neon((float *)dst, (const float *)src, bytes / 4);
    else if (dtype == SR_F16)
        sr_add_f16_neon((uint16_t *)dst, (const uint16_t *)src, bytes / 2);
    else
        sr_add_bf16_neon((uint16_t *)dst, (const uint16_t *)src, bytes / 2);
    return;
#endif
    sr_reduce_add_portable(dst, src, bytes, dtype);
}

#endif
