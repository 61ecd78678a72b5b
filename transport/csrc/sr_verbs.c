/* SparkRing ring transport: the native progress engine of the verbs (RoCE) fabric.
 *
 * Same protocol and same sr_transfer_lanes contract as the tcp engine (sr_engine.c). A neighbour
 * is an sr_vlink: its cable's twins (a Spark cage is two x4 RDMA functions of ~100 Gb/s each,
 * and only both carry the cable's rate), one sr_vpeer per twin. Frames are striped over them in
 * order: frame k of a direction goes on twin k % ntwins on both ends, so the receiver consumes
 * them in the order they were cut, and each twin keeps its own window, sequence and acks.
 * Per twin, two RC queue pairs, both set up from Python (transport/verbs.py):
 *   tx QP: we RDMA WRITE WITH IMMEDIATE each DATA frame (header + payload) into slot
 *          seq % window of the peer's registered rx arena (imm = seq); the peer's ACKs
 *          arrive here as zero-length SEND WITH IMMEDIATE (imm = frames consumed).
 *   rx QP: the peer's frames land in our rx arena; each one consumed is acknowledged.
 * A sender never has more than `window` frames unacknowledged, so a slot is overwritten
 * only after the consumer said it is done with it. ibv_post_send, ibv_post_recv and
 * ibv_poll_cq are static inline in verbs.h, which is why this lives in C.
 * Waiting spins on the CQ for SPIN_US, then sleeps on the CQ's completion channel: spinning
 * alone would starve a software RDMA stack (rdma_rxe) sharing the CPU.
 *
 * Liveness: a heartbeat is a repeated ACK (the same consumed count again), which the peer takes
 * as "still here". sr_vlink_keepalive (called by the fabric's keeper thread, transport/liveness.py)
 * sends one on each twin when nothing went for heartbeat_ms and names the peer dead when nothing
 * came for dead_ms; a call waiting on a link sends them too. A link's mutex keeps the keeper off
 * it while a call runs (the call polls the same completion queues). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sr_wire.h"

#define WR_DATA 1u
#define WR_ACK 2u
#define WR_RECV_TX 3u
#define WR_RECV_RX 4u
#define SPIN_US 50
#define SLEEP_SLICE_MS 50

#define SR_MAX_TWINS 2

typedef struct sr_vpeer {
    int my_rank, peer_rank, twin;
    struct ibv_qp *tx_qp, *rx_qp;
    struct ibv_cq *cq;
    struct ibv_comp_channel *channel;
    unsigned char *rx_slots, *tx_slots; /* window x (header + slot_bytes) each, in one MR */
    uint32_t lkey, rkey, slot_bytes, window, max_send;
    uint64_t remote_addr; /* the peer's rx slots */
    uint64_t tx_seq, tx_acked;
    uint64_t rx_arrived, rx_consumed;
    uint32_t sends_outstanding;
    uint64_t completions;
    uint64_t stats[6]; /* frames tx, frames rx, bytes tx, bytes rx, acks tx, acks rx */
    int64_t heard_us, sent_us; /* the last completion from the peer; the last ack or heartbeat we posted */
} sr_vpeer;

typedef struct sr_vlink {
    int ntwins;
    sr_vpeer *twin[SR_MAX_TWINS];
    uint64_t tx_frames, rx_frames; /* frames cut / consumed in this direction, over every twin */
    pthread_mutex_t mu;            /* held by a call for its whole length; the keeper only tries it */
    int heartbeat_ms;              /* set by the first sr_vlink_keepalive; 0: no heartbeats yet */
} sr_vlink;

static int64_t vnow_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static size_t stride(const sr_vpeer *p) { return SR_HEADER_BYTES + p->slot_bytes; }

static int post_recv(struct ibv_qp *qp, uint64_t tag) {
    struct ibv_recv_wr wr = {.wr_id = tag, .num_sge = 0}, *bad = NULL;
    return ibv_post_recv(qp, &wr, &bad);
}

/* arena: 2 * window * (32 + slot_bytes) bytes registered as lkey/rkey; rx slots first. */
sr_vpeer *sr_vpeer_new(int my_rank, int peer_rank, struct ibv_qp *tx_qp, struct ibv_qp *rx_qp, struct ibv_cq *cq,
                       struct ibv_comp_channel *channel, void *arena, uint32_t lkey, uint64_t remote_addr, uint32_t rkey, uint32_t slot_bytes,
                       uint32_t window, uint32_t max_send) {
    if (slot_bytes == 0 || slot_bytes % 8 || window == 0 || max_send < 2 * window)
        return NULL;
    sr_vpeer *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    *p = (sr_vpeer){.my_rank = my_rank, .peer_rank = peer_rank, .tx_qp = tx_qp, .rx_qp = rx_qp, .cq = cq,
                    .channel = channel, .lkey = lkey, .rkey = rkey, .slot_bytes = slot_bytes, .window = window,
                    .max_send = max_send, .remote_addr = remote_addr};
    p->heard_us = p->sent_us = vnow_us();
    p->rx_slots = arena;
    p->tx_slots = (unsigned char *)arena + (size_t)window * stride(p);
    for (uint32_t i = 0; i < window; i++) /* a receive per slot on rx, per possible ack on tx */
        if (post_recv(rx_qp, WR_RECV_RX) || post_recv(tx_qp, WR_RECV_TX)) {
            free(p);
            return NULL;
        }
    return p;
}


void sr_vpeer_stats(const sr_vpeer *p, uint64_t out[6]) { memcpy(out, p->stats, sizeof p->stats); }

/* Drain the peer's CQ: count arrivals and acks, repost receives, surface errors. */
static int poll_peer(sr_vpeer *p, sr_error *err) {
    struct ibv_wc wc[16];
    for (;;) {
        int n = ibv_poll_cq(p->cq, 16, wc);
        if (n < 0)
            return sr_fail(err, SR_EIO, p->peer_rank, "polling the completion queue of rank %d failed", p->peer_rank);
        if (n == 0)
            return 0;
        p->completions += (uint64_t)n;
        for (int i = 0; i < n; i++) {
            if (wc[i].status != IBV_WC_SUCCESS)
                return sr_fail(err, wc[i].status == IBV_WC_RETRY_EXC_ERR ? SR_ECLOSED : SR_EIO, p->peer_rank,
                             "RDMA %s with rank %d (twin %d) failed: %s (vendor error 0x%x)",
                             wc[i].wr_id == WR_DATA ? "write" : wc[i].wr_id == WR_ACK ? "ack" : "receive",
                             p->peer_rank, p->twin, ibv_wc_status_str(wc[i].status), wc[i].vendor_err);
            switch (wc[i].wr_id) {
            case WR_DATA:
            case WR_ACK:
                p->sends_outstanding--;
                break;
            case WR_RECV_RX: /* a DATA frame landed; RC keeps them in order */
                p->heard_us = vnow_us();
                if (ntohl(wc[i].imm_data) != (uint32_t)p->rx_arrived)
                    return sr_fail(err, SR_ESEQ, p->peer_rank, "frame imm %u from rank %d out of sequence (expected %u)",
                                 ntohl(wc[i].imm_data), p->peer_rank, (uint32_t)p->rx_arrived);
                p->rx_arrived++;
                if (post_recv(p->rx_qp, WR_RECV_RX))
                    return sr_fail(err, SR_EIO, p->peer_rank, "reposting a receive for rank %d failed", p->peer_rank);
                break;
            case WR_RECV_TX: { /* an ACK: 32-bit count, widened against what we sent */
                uint64_t acked = p->tx_acked + (uint32_t)(ntohl(wc[i].imm_data) - (uint32_t)p->tx_acked);
                p->heard_us = vnow_us();
                if (acked == p->tx_acked) { /* the same count again: a heartbeat */
                    if (post_recv(p->tx_qp, WR_RECV_TX))
                        return sr_fail(err, SR_EIO, p->peer_rank, "reposting a receive for rank %d failed", p->peer_rank);
                    break;
                }
                if (acked < p->tx_acked || acked > p->tx_seq)
                    return sr_fail(err, SR_ESEQ, p->peer_rank, "ack %llu from rank %d out of sequence (acked %llu, sent %llu)",
                                 (unsigned long long)acked, p->peer_rank, (unsigned long long)p->tx_acked,
                                 (unsigned long long)p->tx_seq);
                p->tx_acked = acked;
                p->stats[5]++;
                if (post_recv(p->tx_qp, WR_RECV_TX))
                    return sr_fail(err, SR_EIO, p->peer_rank, "reposting a receive for rank %d failed", p->peer_rank);
                break;
            }
            default:
                return sr_fail(err, SR_EPROTO, p->peer_rank, "unexpected completion from rank %d", p->peer_rank);
            }
        }
    }
}

static int post_send(sr_vpeer *p, struct ibv_send_wr *wr, sr_error *err) {
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(wr->opcode == IBV_WR_SEND_WITH_IMM ? p->rx_qp : p->tx_qp, wr, &bad);
    if (rc)
        return sr_fail(err, SR_EIO, p->peer_rank, "posting to rank %d failed: %s", p->peer_rank, strerror(rc));
    p->sends_outstanding++;
    return 0;
}

/* Post the next DATA frame if the window and the send queue allow; 1 if posted. */
static int post_frame(sr_vpeer *p, const unsigned char *buf, size_t len, size_t *framed, sr_error *err) {
    if (*framed == len || p->tx_seq - p->tx_acked >= p->window || p->sends_outstanding >= p->max_send)
        return 0;
    size_t n = len - *framed < p->slot_bytes ? len - *framed : p->slot_bytes;
    uint32_t slot = (uint32_t)(p->tx_seq % p->window);
    unsigned char *dst = p->tx_slots + slot * stride(p);
    memcpy(dst + SR_HEADER_BYTES, buf + *framed, n);
    sr_header_fill((sr_header *)dst, SR_KIND_DATA, (uint16_t)p->my_rank, (uint16_t)p->peer_rank, p->tx_seq,
                   dst + SR_HEADER_BYTES, (uint32_t)n);
    struct ibv_sge sge = {.addr = (uintptr_t)dst, .length = (uint32_t)(SR_HEADER_BYTES + n), .lkey = p->lkey};
    struct ibv_send_wr wr = {.wr_id = WR_DATA, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                             .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl((uint32_t)p->tx_seq)};
    wr.wr.rdma.remote_addr = p->remote_addr + slot * stride(p);
    wr.wr.rdma.rkey = p->rkey;
    int rc = post_send(p, &wr, err);
    if (rc)
        return rc;
    p->tx_seq++;
    *framed += n;
    p->stats[0]++;
    p->stats[2] += n;
    return 1;
}

/* Consume the next arrived frame into rbuf (copy or add) and acknowledge it; 1 if done. */
static int consume_frame(sr_vpeer *p, unsigned char *rbuf, size_t len, size_t *done, int op, int dtype, sr_error *err) {
    if (*done == len || p->rx_consumed == p->rx_arrived || p->sends_outstanding >= p->max_send)
        return 0;
    const unsigned char *slot = p->rx_slots + (p->rx_consumed % p->window) * stride(p);
    sr_header h;
    memcpy(&h, slot, sizeof h);
    if (h.magic != SR_FRAME_MAGIC || sr_checksum_bytes(&h, SR_HEADER_BYTES - 4) != h.header_sum)
        return sr_fail(err, SR_ECORRUPT, p->peer_rank, "corrupted frame header from rank %d", p->peer_rank);
    size_t want = len - *done < p->slot_bytes ? len - *done : p->slot_bytes;
    if (h.version != SR_WIRE_VERSION || h.kind != SR_KIND_DATA || h.src_rank != p->peer_rank ||
        h.dst_rank != p->my_rank || h.length != want)
        return sr_fail(err, SR_EPROTO, p->peer_rank, "unexpected frame from rank %d (kind %u, src %u, dst %u, %u bytes, expected %zu)",
                     p->peer_rank, h.kind, h.src_rank, h.dst_rank, h.length, want);
    if (h.seq != p->rx_consumed)
        return sr_fail(err, SR_ESEQ, p->peer_rank, "frame %llu from rank %d out of sequence (expected %llu)",
                     (unsigned long long)h.seq, p->peer_rank, (unsigned long long)p->rx_consumed);
    if (sr_checksum_bytes(slot + SR_HEADER_BYTES, h.length) != h.payload_sum)
        return sr_fail(err, SR_ECORRUPT, p->peer_rank, "corrupted payload in frame %llu from rank %d",
                     (unsigned long long)h.seq, p->peer_rank);
    if (op == SR_OP_ADD)
        sr_reduce_add(rbuf + *done, slot + SR_HEADER_BYTES, h.length, dtype);
    else
        memcpy(rbuf + *done, slot + SR_HEADER_BYTES, h.length);
    *done += h.length;
    p->rx_consumed++;
    p->stats[1]++;
    p->stats[3] += h.length;
    struct ibv_send_wr wr = {.wr_id = WR_ACK, .num_sge = 0, .opcode = IBV_WR_SEND_WITH_IMM,
                             .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl((uint32_t)p->rx_consumed)};
    int rc = post_send(p, &wr, err);
    if (rc)
        return rc;
    p->stats[4]++;
    p->sent_us = vnow_us();
    return 1;
}

/* A heartbeat (the consumed count again) when nothing went to the peer for heartbeat_ms. */
static int heartbeat(sr_vpeer *p, int heartbeat_ms, sr_error *err) {
    if (heartbeat_ms <= 0 || vnow_us() - p->sent_us < (int64_t)heartbeat_ms * 1000 ||
        p->sends_outstanding >= p->max_send)
        return 0;
    struct ibv_send_wr wr = {.wr_id = WR_ACK, .num_sge = 0, .opcode = IBV_WR_SEND_WITH_IMM,
                             .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl((uint32_t)p->rx_consumed)};
    int rc = post_send(p, &wr, err);
    if (!rc)
        p->sent_us = vnow_us();
    return rc;
}

/* Arm the CQ events and sleep on the completion channels of n distinct peers for at most
 * ms; the caller polls the CQs again afterwards. */
static int sleep_on_cqs(sr_vpeer *const *peers, int n, int ms, sr_error *err) {
    struct pollfd fds[2 * SR_MAX_LANES * SR_MAX_TWINS];
    for (int i = 0; i < n; i++) {
        if (ibv_req_notify_cq(peers[i]->cq, 0))
            return sr_fail(err, SR_EIO, peers[i]->peer_rank, "arming the CQ of rank %d failed", peers[i]->peer_rank);
        fds[i] = (struct pollfd){.fd = peers[i]->channel->fd, .events = POLLIN};
    }
    /* A completion that landed before the arm raised no event: look once more, and do not
     * sleep if it changed anything. */
    for (int i = 0; i < n; i++) {
        uint64_t before = peers[i]->completions;
        int rc = poll_peer(peers[i], err);
        if (rc)
            return rc;
        if (peers[i]->completions != before)
            ms = 0;
    }
    if (poll(fds, (nfds_t)n, ms) < 0)
        return sr_fail(err, SR_EIO, -1, "poll on completion channels failed");
    for (int i = 0; i < n; i++) {
        if (fds[i].revents & POLLIN) {
            struct ibv_cq *ev_cq;
            void *ctx;
            if (ibv_get_cq_event(peers[i]->channel, &ev_cq, &ctx) == 0)
                ibv_ack_cq_events(ev_cq, 1);
        }
    }
    return 0;
}

/* Free after the peer acknowledged every frame and our own acks left (bounded by linger_ms;
 * 0 on a failed communicator), so destroying the QPs cannot drop the peer's last ack. */
void sr_vpeer_free(sr_vpeer *p, int linger_ms) {
    if (!p)
        return;
    int64_t deadline = vnow_us() + (int64_t)linger_ms * 1000;
    sr_error ignored;
    while ((p->tx_acked < p->tx_seq || p->sends_outstanding) && vnow_us() < deadline)
        if (poll_peer(p, &ignored) || sleep_on_cqs(&p, 1, 10, &ignored))
            break;
    free(p);
}

/* A neighbour over `n` twins (1..SR_MAX_TWINS), each an sr_vpeer already connected; NULL on bad
 * arguments. The link owns the twins from here on (sr_vlink_free frees them). */
sr_vlink *sr_vlink_new(sr_vpeer *const *twins, int n) {
    if (n < 1 || n > SR_MAX_TWINS)
        return NULL;
    sr_vlink *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->ntwins = n;
    pthread_mutex_init(&l->mu, NULL);
    for (int t = 0; t < n; t++) {
        if (!twins[t] || twins[t]->peer_rank != twins[0]->peer_rank || twins[t]->slot_bytes != twins[0]->slot_bytes) {
            free(l);
            return NULL;
        }
        l->twin[t] = twins[t];
        l->twin[t]->twin = t;
    }
    return l;
}

void sr_vlink_free(sr_vlink *l, int linger_ms) {
    if (!l)
        return;
    for (int t = 0; t < l->ntwins; t++)
        sr_vpeer_free(l->twin[t], linger_ms);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

/* The keeper's turn on an idle link: drain completions, send heartbeats, judge. 0; 1 when a
 * call holds the link (it watches it then); or -SR_ETIMEOUT (nothing from the peer for dead_ms)
 * or another failure, with err naming the peer. */
int sr_vlink_keepalive(sr_vlink *l, int heartbeat_ms, int dead_ms, sr_error *err) {
    if (pthread_mutex_trylock(&l->mu))
        return 1;
    l->heartbeat_ms = heartbeat_ms;
    int rc = 0;
    int64_t now = vnow_us();
    for (int t = 0; t < l->ntwins && !rc; t++) {
        sr_vpeer *p = l->twin[t];
        if ((rc = poll_peer(p, err)) || (rc = heartbeat(p, heartbeat_ms, err)))
            break;
        int64_t silent_ms = (now - p->heard_us) / 1000;
        if (silent_ms > dead_ms)
            rc = sr_fail(err, SR_ETIMEOUT, p->peer_rank, "rank %d stopped answering: nothing heard for %lld ms (twin %d)",
                         p->peer_rank, (long long)silent_ms, p->twin);
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}

/* The twins' counters, summed (frames tx, frames rx, bytes tx, bytes rx, acks tx, acks rx). */
void sr_vlink_stats(const sr_vlink *l, uint64_t out[6]) {
    memset(out, 0, 6 * sizeof *out);
    for (int t = 0; t < l->ntwins; t++)
        for (int k = 0; k < 6; k++)
            out[k] += l->twin[t]->stats[k];
}

/* The next frame of a direction goes on twin (frames so far) % ntwins; 1 if one was posted. */
static int link_post_frame(sr_vlink *l, const unsigned char *buf, size_t len, size_t *framed, sr_error *err) {
    int rc = post_frame(l->twin[l->tx_frames % (uint64_t)l->ntwins], buf, len, framed, err);
    if (rc > 0)
        l->tx_frames++;
    return rc;
}

static int link_consume_frame(sr_vlink *l, unsigned char *rbuf, size_t len, size_t *done, int op, int dtype,
                              sr_error *err) {
    int rc = consume_frame(l->twin[l->rx_frames % (uint64_t)l->ntwins], rbuf, len, done, op, dtype, err);
    if (rc > 0)
        l->rx_frames++;
    return rc;
}

/* Earlier lanes that share a link go first: its frames follow one order per direction. */
static int lane_waits(sr_vlink *const *link, const size_t *have, const size_t *len, int i) {
    for (int j = 0; j < i; j++)
        if (link[j] == link[i] && have[j] < len[j])
            return 1;
    return 0;
}

/* Add the twins of l to the set of n distinct peers (NULL is skipped). */
static void add_twins(sr_vpeer **set, int *n, const sr_vlink *l) {
    if (!l)
        return;
    for (int t = 0; t < l->ntwins; t++) {
        int known = 0;
        for (int k = 0; k < *n; k++)
            known |= set[k] == l->twin[t];
        if (!known)
            set[(*n)++] = l->twin[t];
    }
}

static int run_vlanes(const sr_lane *lanes, int n, int op, int dtype, int timeout_ms, sr_vlink **to, sr_vlink **from,
                      const size_t *slen, const size_t *rlen, size_t *framed, size_t *done, sr_vpeer **peers, int npeers,
                      sr_vlink **held, int nheld, sr_error *err);

/* The tcp engine's sr_transfer_lanes contract, over RDMA: the lanes' peers are sr_vlinks. */
int sr_vtransfer_lanes(const sr_lane *lanes, int n, int op, int dtype, int timeout_ms, sr_error *err) {
    if (n < 1 || n > SR_MAX_LANES || (op == SR_OP_ADD && dtype != SR_F32 && dtype != SR_F16 && dtype != SR_BF16))
        return sr_fail(err, SR_EARG, -1, "invalid transfer arguments");
    sr_vlink *to[SR_MAX_LANES], *from[SR_MAX_LANES];
    sr_vpeer *peers[2 * SR_MAX_LANES * SR_MAX_TWINS];
    size_t slen[SR_MAX_LANES], rlen[SR_MAX_LANES], framed[SR_MAX_LANES] = {0}, done[SR_MAX_LANES] = {0};
    int npeers = 0;
    for (int i = 0; i < n; i++) {
        if ((!lanes[i].to && lanes[i].slen) || (!lanes[i].from && lanes[i].rlen))
            return sr_fail(err, SR_EARG, -1, "invalid transfer arguments");
        to[i] = lanes[i].to;
        from[i] = lanes[i].from;
        slen[i] = to[i] ? lanes[i].slen : 0;
        rlen[i] = from[i] ? lanes[i].rlen : 0;
        add_twins(peers, &npeers, to[i]);
        add_twins(peers, &npeers, from[i]);
    }
    sr_vlink *held[2 * SR_MAX_LANES];
    int nheld = 0;
    for (int i = 0; i < n; i++) /* each distinct link once, in address order (no lock-order cycles) */
        for (int side = 0; side < 2; side++) {
            sr_vlink *l = side ? from[i] : to[i];
            int known = !l;
            for (int k = 0; k < nheld && !known; k++)
                known = held[k] == l;
            if (!known)
                held[nheld++] = l;
        }
    for (int a = 1; a < nheld; a++)
        for (int b = a; b > 0 && (uintptr_t)held[b] < (uintptr_t)held[b - 1]; b--) {
            sr_vlink *x = held[b];
            held[b] = held[b - 1];
            held[b - 1] = x;
        }
    for (int k = 0; k < nheld; k++)
        pthread_mutex_lock(&held[k]->mu);
    int rc = run_vlanes(lanes, n, op, dtype, timeout_ms, to, from, slen, rlen, framed, done, peers, npeers, held,
                        nheld, err);
    for (int k = 0; k < nheld; k++)
        pthread_mutex_unlock(&held[k]->mu);
    return rc;
}

/* sr_vtransfer_lanes with its links held. */
static int run_vlanes(const sr_lane *lanes, int n, int op, int dtype, int timeout_ms, sr_vlink **to, sr_vlink **from,
                      const size_t *slen, const size_t *rlen, size_t *framed, size_t *done, sr_vpeer **peers, int npeers,
                      sr_vlink **held, int nheld, sr_error *err) {
    int64_t now = vnow_us(), deadline = now + (int64_t)timeout_ms * 1000, spin_until = now + SPIN_US;
    for (;;) {
        int rc = 0, progress = 0, finished = 1;
        for (int k = 0; k < npeers; k++)
            if ((rc = poll_peer(peers[k], err)))
                return rc;
        for (int i = 0; i < n; i++) {
            if (to[i] && !lane_waits(to, framed, slen, i)) {
                while (framed[i] < slen[i] && (rc = link_post_frame(to[i], lanes[i].sbuf, slen[i], &framed[i], err)) > 0)
                    progress = 1;
                if (rc < 0)
                    return rc;
            }
            if (from[i] && !lane_waits(from, done, rlen, i)) {
                while (done[i] < rlen[i] &&
                       (rc = link_consume_frame(from[i], lanes[i].rbuf, rlen[i], &done[i], op, dtype, err)) > 0)
                    progress = 1;
                if (rc < 0)
                    return rc;
            }
        }
        for (int i = 0; i < n; i++)
            if (framed[i] < slen[i] || done[i] < rlen[i])
                finished = 0;
        if (finished)
            return 0;
        now = vnow_us();
        if (progress) {
            spin_until = now + SPIN_US;
            continue;
        }
        if (now >= deadline) {
            int i = 0;
            while (done[i] == rlen[i] && framed[i] == slen[i])
                i++;
            int receiving = done[i] < rlen[i];
            sr_vlink *l = receiving ? from[i] : to[i];
            sr_vpeer *p = l->twin[(receiving ? l->rx_frames : l->tx_frames) % (uint64_t)l->ntwins];
            return sr_fail(err, SR_ETIMEOUT, p->peer_rank, "timed out after %d ms %s rank %d (twin %d)", timeout_ms,
                         receiving ? "waiting for data from" : "sending to (window full, no ack from)", p->peer_rank,
                         p->twin);
        }
        if (now < spin_until)
            continue;
        for (int k = 0; k < nheld; k++) /* a long wait says "still here" to the link's peer */
            for (int t = 0; t < held[k]->ntwins; t++)
                if ((rc = heartbeat(held[k]->twin[t], held[k]->heartbeat_ms, err)))
                    return rc;
        int64_t left_ms = (deadline - now + 999) / 1000;
        if ((rc = sleep_on_cqs(peers, npeers, left_ms < SLEEP_SLICE_MS ? (int)left_ms : SLEEP_SLICE_MS, err)))
            return rc;
    }
}
