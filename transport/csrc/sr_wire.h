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

#define SR_FRAME_MAGIC 0x31465253u /* "SRF1" little-endian */
#define SR_WIRE_VERSION 1
#define SR_KIND_DATA 1
#define SR_KIND_ACK 2
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

enum sr_status {
    SR_OK = 0,
    SR_ETIMEOUT = 1,  /* the bound passed */
    SR_ECLOSED = 2,   /* the peer closed or reset the connection */
    SR_ECORRUPT = 3,  /* a checksum did not match */
    SR_ESEQ = 4,      /* a frame out of sequence */
    SR_EPROTO = 5,    /* bad magic, version, kind, rank or length */
    SR_EIO = 6,       /* a system call failed */
    SR_EARG = 7,      /* the caller passed something invalid */
};

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
 * (an engine's peer handle, sr_peer or sr_vpeer; either may be NULL). A call runs up to
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

/* Four independent multiply-rotate lanes: fast enough to run on every byte at link rate,
 * and any change to one 8-byte word changes the result (a bijection per lane). */
static inline uint64_t sr_mix(uint64_t h, uint64_t w) {
    h ^= w * 0x9E3779B97F4A7C15ull;
    h = (h << 31) | (h >> 33);
    return h * 0xC2B2AE3D27D4EB4Full;
}

static inline uint32_t sr_checksum_bytes(const void *data, size_t len) {
    const unsigned char *p = (const unsigned char *)data;
    uint64_t a = 0x243F6A8885A308D3ull, b = 0x13198A2E03707344ull;
    uint64_t c = 0xA4093822299F31D0ull, d = 0x082EFA98EC4E6C89ull;
    size_t i = 0;
    for (; i + 32 <= len; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, 32);
        a = sr_mix(a, w[0]);
        b = sr_mix(b, w[1]);
        c = sr_mix(c, w[2]);
        d = sr_mix(d, w[3]);
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        a = sr_mix(a, w);
    }
    if (i < len) {
        uint64_t w = 0;
        memcpy(&w, p + i, len - i);
        b = sr_mix(b, w ^ 0xFFull);
    }
    uint64_t h = sr_mix(sr_mix(a, b), sr_mix(c, d)) ^ (uint64_t)len;
    h = sr_mix(h, 0x9E3779B97F4A7C15ull);
    return (uint32_t)(h ^ (h >> 32));
}

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

/* fp16 <-> fp32 by bits, round to nearest even: identical to numpy's astype. */
static inline float sr_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while ((man & 0x400u) == 0);
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t sr_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t exp = (x >> 23) & 0xFFu, man = x & 0x7FFFFFu;
    if (exp == 0xFF) { /* inf, or NaN with its top payload bits (never 0), as numpy does */
        uint16_t top = (uint16_t)(man >> 13);
        return sign | 0x7C00u | (man && !top ? 1u : top);
    }
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return sign | 0x7C00u;
    if (e <= 0) {
        if (e < -10)
            return sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = 1u << (shift - 1), rest = man & ((1u << shift) - 1), q = man >> shift;
        if (rest > half || (rest == half && (q & 1u)))
            q++;
        return sign | (uint16_t)q;
    }
    uint32_t q = ((uint32_t)e << 10) | (man >> 13), rest = man & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (q & 1u)))
        q++; /* may carry into the exponent, up to inf: correct */
    return sign | (uint16_t)q;
}

static inline float sr_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t sr_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN, as torch does */
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

/* dst[i] = dst[i] + src[i]; fp16/bf16 add in fp32 and round once. Addition is commutative
 * bit for bit, so both ends of an exchange produce the same bytes. */
static inline void sr_reduce_add(void *dst, const void *src, size_t bytes, int dtype) {
    if (dtype == SR_F32) {
        float *d = (float *)dst;
        const float *s = (const float *)src;
        for (size_t i = 0, n = bytes / 4; i < n; i++)
            d[i] = d[i] + s[i];
    } else if (dtype == SR_F16) {
        uint16_t *d = (uint16_t *)dst;
        const uint16_t *s = (const uint16_t *)src;
        for (size_t i = 0, n = bytes / 2; i < n; i++)
            d[i] = sr_f32_to_f16(sr_f16_to_f32(d[i]) + sr_f16_to_f32(s[i]));
    } else {
        uint16_t *d = (uint16_t *)dst;
        const uint16_t *s = (const uint16_t *)src;
        for (size_t i = 0, n = bytes / 2; i < n; i++)
            d[i] = sr_f32_to_bf16(sr_bf16_to_f32(d[i]) + sr_bf16_to_f32(s[i]));
    }
}

#endif
