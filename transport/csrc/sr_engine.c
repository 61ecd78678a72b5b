/* SparkRing ring transport: the native progress engine of the tcp fabric.
 *
 * A peer is one ring neighbour reached over two directed TCP connections: on tx we send
 * DATA frames and read ACKs, on rx we read DATA frames and write ACKs. sr_transfer_lanes()
 * runs up to SR_MAX_LANES lanes at once, each sending one buffer to a peer while it receives
 * (copy or add) another from a peer, frame by frame, with a bounded window of unacknowledged
 * frames per peer and one deadline for the whole call. The loop never returns to Python until
 * the call is complete or has failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "sr_wire.h"

typedef struct sr_peer {
    int my_rank, peer_rank;
    int tx_fd, rx_fd;
    uint32_t slot_bytes, window;
    uint64_t tx_seq;   /* next DATA sequence to send */
    uint64_t tx_acked; /* DATA frames the peer has consumed */
    uint64_t rx_seq;   /* next DATA sequence expected */
    uint64_t rx_acked; /* highest ACK value written */
    int rx_gone;       /* the peer closed after its last frame: acks have nowhere to go */
    sr_header ack_in;  /* an ACK being read */
    size_t ack_in_have;
    sr_header ack_out; /* an ACK being written */
    size_t ack_out_off, ack_out_len;
    unsigned char *staging; /* one slot: a DATA payload is checked here before it is added */
    uint64_t stats[6];      /* frames tx, frames rx, bytes tx, bytes rx, acks tx, acks rx */
} sr_peer;

static int pump_acks(sr_peer *p, sr_error *err);
static int64_t now_ms(void);

int sr_abi_version(void) { return SR_WIRE_VERSION; }

uint32_t sr_checksum(const void *data, size_t len) { return sr_checksum_bytes(data, len); }

void sr_reduce(void *dst, const void *src, size_t bytes, int dtype) { sr_reduce_add(dst, src, bytes, dtype); }

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Buffer sizes are left to TCP autotuning: a fixed SO_SNDBUF/SO_RCVBUF caps it at wmem_max. */
static void tune_socket(int fd) {
    int one = 1;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails on AF_UNIX: harmless */
}

sr_peer *sr_peer_new(int my_rank, int peer_rank, int tx_fd, int rx_fd, uint32_t slot_bytes, uint32_t window) {
    if (slot_bytes == 0 || slot_bytes % 8 || window == 0)
        return NULL;
    sr_peer *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->staging = malloc(slot_bytes);
    if (!p->staging) {
        free(p);
        return NULL;
    }
    p->my_rank = my_rank;
    p->peer_rank = peer_rank;
    p->tx_fd = tx_fd;
    p->rx_fd = rx_fd;
    p->slot_bytes = slot_bytes;
    p->window = window;
    tune_socket(tx_fd);
    if (rx_fd != tx_fd)
        tune_socket(rx_fd);
    return p;
}

/* Close after the peer has acknowledged every frame we sent (bounded by linger_ms; 0 on a
 * failed communicator). Closing with its acks unread would make the kernel reset the
 * connection, and a reset discards the frames the peer has not read yet. */
void sr_peer_free(sr_peer *p, int linger_ms) {
    if (!p)
        return;
    int64_t deadline = now_ms() + linger_ms;
    while (p->tx_acked < p->tx_seq) {
        sr_error ignored;
        int64_t left = deadline - now_ms();
        if (left <= 0 || pump_acks(p, &ignored) || p->tx_acked == p->tx_seq)
            break;
        struct pollfd f = {.fd = p->tx_fd, .events = POLLIN};
        poll(&f, 1, (int)left);
    }
    shutdown(p->tx_fd, SHUT_WR);
    close(p->tx_fd);
    if (p->rx_fd != p->tx_fd)
        close(p->rx_fd);
    free(p->staging);
    free(p);
}

void sr_peer_stats(const sr_peer *p, uint64_t out[6]) { memcpy(out, p->stats, sizeof p->stats); }

/* One direction of a call: what is left to send or to receive. */
typedef struct sendstate {
    sr_peer *peer;
    const unsigned char *buf;
    size_t len, framed; /* payload bytes handed to frames so far */
    sr_header hdr;      /* the frame being written */
    size_t frame_len, frame_off; /* header + payload bytes of it, and how many are written */
    const unsigned char *frame_payload;
} sendstate;

typedef struct recvstate {
    sr_peer *peer;
    unsigned char *buf;
    size_t len, done; /* payload bytes consumed */
    int op, dtype;
    sr_header hdr;
    size_t hdr_have, payload_have;
} recvstate;

static int io_fail(sr_error *err, sr_peer *p, const char *what, ssize_t n) {
    if (n == 0)
        return sr_fail(err, SR_ECLOSED, p->peer_rank, "rank %d closed the connection while we %s", p->peer_rank, what);
    return sr_fail(err, errno == ECONNRESET || errno == EPIPE ? SR_ECLOSED : SR_EIO, p->peer_rank,
                "%s rank %d: %s", what, p->peer_rank, strerror(errno));
}

static int check_header(const sr_header *h, sr_peer *p, uint8_t kind, sr_error *err) {
    if (h->magic != SR_FRAME_MAGIC)
        return sr_fail(err, SR_EPROTO, p->peer_rank, "bad frame magic 0x%08x from rank %d", h->magic, p->peer_rank);
    if (sr_checksum_bytes(h, SR_HEADER_BYTES - 4) != h->header_sum)
        return sr_fail(err, SR_ECORRUPT, p->peer_rank, "corrupted frame header from rank %d", p->peer_rank);
    if (h->version != SR_WIRE_VERSION || h->kind != kind || h->src_rank != p->peer_rank || h->dst_rank != p->my_rank)
        return sr_fail(err, SR_EPROTO, p->peer_rank,
                    "unexpected frame from rank %d: version %u kind %u src %u dst %u (expected %d, %u, %d, %d)",
                    p->peer_rank, h->version, h->kind, h->src_rank, h->dst_rank, SR_WIRE_VERSION, kind,
                    p->peer_rank, p->my_rank);
    return 0;
}

/* Read ACKs on tx until the socket would block. */
static int pump_acks(sr_peer *p, sr_error *err) {
    for (;;) {
        ssize_t n = recv(p->tx_fd, (char *)&p->ack_in + p->ack_in_have, SR_HEADER_BYTES - p->ack_in_have, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return io_fail(err, p, "waited for an ack from", n);
        p->ack_in_have += (size_t)n;
        if (p->ack_in_have < SR_HEADER_BYTES)
            continue;
        p->ack_in_have = 0;
        int rc = check_header(&p->ack_in, p, SR_KIND_ACK, err);
        if (rc)
            return rc;
        if (p->ack_in.seq <= p->tx_acked || p->ack_in.seq > p->tx_seq)
            return sr_fail(err, SR_ESEQ, p->peer_rank, "ack %llu from rank %d out of sequence (acked %llu, sent %llu)",
                        (unsigned long long)p->ack_in.seq, p->peer_rank, (unsigned long long)p->tx_acked,
                        (unsigned long long)p->tx_seq);
        p->tx_acked = p->ack_in.seq;
        p->stats[5]++;
    }
}

/* Write the pending ACK (the latest consumed count) on rx until done or it would block. A
 * sender may finish and close before reading our last ack; that is not an error here (a
 * later receive from it fails instead). */
static int pump_ack_out(sr_peer *p, sr_error *err) {
    while (!p->rx_gone) {
        if (p->ack_out_off == p->ack_out_len) {
            if (p->rx_acked == p->rx_seq)
                return 0;
            sr_header_fill(&p->ack_out, SR_KIND_ACK, (uint16_t)p->my_rank, (uint16_t)p->peer_rank, p->rx_seq, NULL, 0);
            p->rx_acked = p->rx_seq;
            p->ack_out_off = 0;
            p->ack_out_len = SR_HEADER_BYTES;
            p->stats[4]++;
        }
        ssize_t n = send(p->rx_fd, (char *)&p->ack_out + p->ack_out_off, p->ack_out_len - p->ack_out_off,
                         MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            p->rx_gone = 1;
            p->ack_out_off = p->ack_out_len;
            return 0;
        }
        if (n <= 0)
            return io_fail(err, p, "acked", n);
        p->ack_out_off += (size_t)n;
    }
    return 0;
}

static int send_done(const sendstate *s) { return s->framed == s->len && s->frame_off == s->frame_len; }

static int pump_send(sendstate *s, sr_error *err) {
    sr_peer *p = s->peer;
    for (;;) {
        if (s->frame_off == s->frame_len) {
            if (s->framed == s->len || p->tx_seq - p->tx_acked >= p->window)
                return 0; /* nothing left, or the window is full until an ack arrives */
            size_t n = s->len - s->framed < p->slot_bytes ? s->len - s->framed : p->slot_bytes;
            s->frame_payload = s->buf + s->framed;
            sr_header_fill(&s->hdr, SR_KIND_DATA, (uint16_t)p->my_rank, (uint16_t)p->peer_rank, p->tx_seq,
                           s->frame_payload, (uint32_t)n);
            p->tx_seq++;
            s->framed += n;
            s->frame_len = SR_HEADER_BYTES + n;
            s->frame_off = 0;
            p->stats[0]++;
            p->stats[2] += n;
        }
        struct iovec iov[2];
        int cnt = 0;
        if (s->frame_off < SR_HEADER_BYTES)
            iov[cnt++] = (struct iovec){(char *)&s->hdr + s->frame_off, SR_HEADER_BYTES - s->frame_off};
        size_t pay_off = s->frame_off > SR_HEADER_BYTES ? s->frame_off - SR_HEADER_BYTES : 0;
        if (s->frame_len > SR_HEADER_BYTES)
            iov[cnt++] = (struct iovec){(void *)(s->frame_payload + pay_off), s->frame_len - SR_HEADER_BYTES - pay_off};
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
        ssize_t n = sendmsg(p->tx_fd, &msg, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return io_fail(err, p, "sent to", n);
        s->frame_off += (size_t)n;
    }
}

static int pump_recv(recvstate *r, sr_error *err) {
    sr_peer *p = r->peer;
    while (r->done < r->len) {
        if (r->hdr_have < SR_HEADER_BYTES) {
            ssize_t n = recv(p->rx_fd, (char *)&r->hdr + r->hdr_have, SR_HEADER_BYTES - r->hdr_have, 0);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return 0;
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return io_fail(err, p, "waited for data from", n);
            r->hdr_have += (size_t)n;
            if (r->hdr_have < SR_HEADER_BYTES)
                continue;
            int rc = check_header(&r->hdr, p, SR_KIND_DATA, err);
            if (rc)
                return rc;
            if (r->hdr.seq != p->rx_seq)
                return sr_fail(err, SR_ESEQ, p->peer_rank, "frame %llu from rank %d out of sequence (expected %llu)",
                            (unsigned long long)r->hdr.seq, p->peer_rank, (unsigned long long)p->rx_seq);
            size_t want = r->len - r->done < p->slot_bytes ? r->len - r->done : p->slot_bytes;
            if (r->hdr.length != want)
                return sr_fail(err, SR_EPROTO, p->peer_rank, "frame %llu from rank %d has %u bytes, expected %zu",
                            (unsigned long long)r->hdr.seq, p->peer_rank, r->hdr.length, want);
            r->payload_have = 0;
        }
        /* A copy lands in place; an add lands in the staging slot and is checked first. */
        unsigned char *dst = r->op == SR_OP_ADD ? p->staging : r->buf + r->done;
        while (r->payload_have < r->hdr.length) {
            ssize_t n = recv(p->rx_fd, dst + r->payload_have, r->hdr.length - r->payload_have, 0);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return 0;
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return io_fail(err, p, "waited for data from", n);
            r->payload_have += (size_t)n;
        }
        if (sr_checksum_bytes(dst, r->hdr.length) != r->hdr.payload_sum)
            return sr_fail(err, SR_ECORRUPT, p->peer_rank, "corrupted payload in frame %llu from rank %d",
                        (unsigned long long)r->hdr.seq, p->peer_rank);
        if (r->op == SR_OP_ADD)
            sr_reduce_add(r->buf + r->done, dst, r->hdr.length, r->dtype);
        r->done += r->hdr.length;
        r->hdr_have = 0;
        p->rx_seq++;
        p->stats[1]++;
        p->stats[3] += r->hdr.length;
        int rc = pump_ack_out(p, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* Earlier lanes that share a peer go first: its frames follow one sequence per direction. */
static int send_waits(const sendstate *s, int i) {
    for (int j = 0; j < i; j++)
        if (s[j].peer == s[i].peer && !send_done(&s[j]))
            return 1;
    return 0;
}

static int recv_waits(const recvstate *r, int i) {
    for (int j = 0; j < i; j++)
        if (r[j].peer == r[i].peer && r[j].done < r[j].len)
            return 1;
    return 0;
}

static int acks_owed(const sr_peer *p) { return p && !p->rx_gone && p->ack_out_off < p->ack_out_len; }

/* Add `events` for fd to the poll set, merging with an entry already there. */
static void want_fd(struct pollfd *fds, int *nfds, int fd, short events) {
    for (int k = 0; k < *nfds; k++)
        if (fds[k].fd == fd) {
            fds[k].events |= events;
            return;
        }
    fds[(*nfds)++] = (struct pollfd){.fd = fd, .events = events};
}

/* Run n lanes at once (a ring step moving two halves in opposite directions is two), each
 * sending to its `to` while receiving (copy or add) from its `from`, within timeout_ms.
 * Returns 0 or -code with err filled. */
int sr_transfer_lanes(const sr_lane *lanes, int n, int op, int dtype, int timeout_ms, sr_error *err) {
    if (n < 1 || n > SR_MAX_LANES || (op == SR_OP_ADD && dtype != SR_F32 && dtype != SR_F16 && dtype != SR_BF16))
        return sr_fail(err, SR_EARG, -1, "invalid transfer arguments");
    sendstate s[SR_MAX_LANES];
    recvstate r[SR_MAX_LANES];
    for (int i = 0; i < n; i++) {
        const sr_lane *l = &lanes[i];
        if ((!l->to && l->slen) || (!l->from && l->rlen))
            return sr_fail(err, SR_EARG, -1, "invalid transfer arguments");
        s[i] = (sendstate){.peer = l->to, .buf = l->sbuf, .len = l->to ? l->slen : 0};
        r[i] = (recvstate){.peer = l->from, .buf = l->rbuf, .len = l->from ? l->rlen : 0, .op = op, .dtype = dtype};
    }
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        int rc, finished = 1;
        for (int i = 0; i < n; i++) {
            if (!s[i].peer || send_done(&s[i]) || send_waits(s, i))
                continue;
            /* Acks of finished sends wait for the next call (or the close). */
            if ((rc = pump_acks(s[i].peer, err)) || (rc = pump_send(&s[i], err)))
                return rc;
        }
        for (int i = 0; i < n; i++) {
            if (r[i].done < r[i].len && !recv_waits(r, i) && (rc = pump_recv(&r[i], err)))
                return rc;
            if (r[i].peer && (rc = pump_ack_out(r[i].peer, err)))
                return rc;
        }
        for (int i = 0; i < n; i++)
            if (!send_done(&s[i]) || r[i].done < r[i].len || acks_owed(r[i].peer))
                finished = 0;
        if (finished)
            return 0;
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            for (int i = 0; i < n; i++)
                if (r[i].done < r[i].len)
                    return sr_fail(err, SR_ETIMEOUT, r[i].peer->peer_rank,
                                "timed out after %d ms waiting for data from rank %d (%zu of %zu bytes)", timeout_ms,
                                r[i].peer->peer_rank, r[i].done, r[i].len);
            for (int i = 0; i < n; i++)
                if (!send_done(&s[i]))
                    return sr_fail(err, SR_ETIMEOUT, s[i].peer->peer_rank,
                                "timed out after %d ms sending to (window full, no ack from) rank %d", timeout_ms,
                                s[i].peer->peer_rank);
            int i = 0;
            while (!acks_owed(r[i].peer))
                i++;
            return sr_fail(err, SR_ETIMEOUT, r[i].peer->peer_rank, "timed out after %d ms acking rank %d", timeout_ms,
                        r[i].peer->peer_rank);
        }
        struct pollfd fds[2 * SR_MAX_LANES];
        int nfds = 0;
        for (int i = 0; i < n; i++) {
            sr_peer *to = s[i].peer, *from = r[i].peer;
            if (to && !send_done(&s[i])) {
                short ev = POLLIN; /* acks open the window */
                if (!send_waits(s, i) && (s[i].frame_off < s[i].frame_len || to->tx_seq - to->tx_acked < to->window))
                    ev |= POLLOUT;
                want_fd(fds, &nfds, to->tx_fd, ev);
            }
            int reading = r[i].done < r[i].len && !recv_waits(r, i);
            if (reading || acks_owed(from))
                want_fd(fds, &nfds, from->rx_fd, (short)((reading ? POLLIN : 0) | (acks_owed(from) ? POLLOUT : 0)));
        }
        int got = poll(fds, (nfds_t)nfds, (int)left);
        if (got < 0 && errno != EINTR)
            return sr_fail(err, SR_EIO, -1, "poll: %s", strerror(errno));
    }
}

/* One lane: send sbuf[slen] to `to` while receiving rbuf[rlen] from `from`. */
int sr_transfer(sr_peer *to, const void *sbuf, size_t slen, sr_peer *from, void *rbuf, size_t rlen, int op,
                int dtype, int timeout_ms, sr_error *err) {
    sr_lane lane = {.to = to, .sbuf = sbuf, .slen = slen, .from = from, .rbuf = rbuf, .rlen = rlen};
    return sr_transfer_lanes(&lane, 1, op, dtype, timeout_ms, err);
}

/* Shut both connections down without freeing: the neighbour sees the link close at once (a
 * failed progress thread aborts its links so the ring fails fast, not after every bound). */
void sr_peer_abort(sr_peer *p) {
    shutdown(p->tx_fd, SHUT_RDWR);
    if (p->rx_fd != p->tx_fd)
        shutdown(p->rx_fd, SHUT_RDWR);
}
