/* SparkRing ring transport: the native progress engine of the tcp fabric.
 *
 * A peer is one ring neighbour reached over two directed TCP connections: on tx we send
 * DATA frames and read ACKs, on rx we read DATA frames and write ACKs. sr_transfer_lanes()
 * runs up to SR_MAX_LANES lanes at once, each sending one buffer to a peer while it receives
 * (copy or add) another from a peer, frame by frame, with a bounded window of unacknowledged
 * frames per peer and one deadline for the whole call. The loop never returns to Python until
 * the call is complete or has failed.
 *
 * A call that moves more than one frame in some direction runs each direction of each peer
 * (a "group": the sends to one peer, or the receives from one) on its own thread: the
 * caller's and the peer's two workers. The copies into and out of the kernel, the checksums
 * and the reductions of the two directions then overlap, and a receiver drains its socket
 * as soon as data lands instead of after its own sends, so TCP's acknowledgements are never
 * held back. The groups touch disjoint state (tx fields and tx_fd, or rx fields, staging
 * and rx_fd), and the first to fail raises an eventfd that ends the others. Single-frame
 * calls (the latency path) stay on the caller's thread. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "sr_wire.h"

/* A thread that runs one group of a call at a time (see the top of the file). */
typedef struct sr_worker {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct sr_call *call; /* the call whose group `group` to run; NULL while idle */
    int group, stop;
} sr_worker;

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
    sr_worker *workers[2];  /* the tx and rx side's threads, started on first use */
    pid_t workers_pid;      /* ... by this process (a forked child has none of them) */
} sr_peer;

static void worker_stop(sr_worker *w);

static int pump_acks(sr_peer *p, sr_error *err);
static int64_t now_ms(void);

int sr_abi_version(void) { return SR_WIRE_VERSION; }

uint32_t sr_checksum(const void *data, size_t len) { return sr_checksum_bytes(data, len); }

/* The checksum's portable loop (what a node without AVX2 runs); exported for the tests. */
uint32_t sr_checksum_portable(const void *data, size_t len) { return sr_checksum_with(data, len, 0); }

void sr_reduce(void *dst, const void *src, size_t bytes, int dtype) { sr_reduce_add(dst, src, bytes, dtype); }

/* The portable loops that a node without AVX2 and F16C runs; exported so that tests on an x86
 * machine hold both paths to the same bytes. */
void sr_reduce_portable(void *dst, const void *src, size_t bytes, int dtype) {
    sr_reduce_add_portable(dst, src, bytes, dtype);
}

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
    if (p->workers_pid == getpid())
        for (int side = 0; side < 2; side++)
            worker_stop(p->workers[side]);
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
    size_t sent;     /* payload bytes the kernel has taken (atomic: an in-place receive reads it) */
    int watched;     /* an in-place receive waits for `sent` to grow (atomic) */
    int progress_fd; /* eventfd raised for it when `sent` grows; -1 on the caller's thread alone */
} sendstate;

typedef struct recvstate {
    sr_peer *peer;
    unsigned char *buf;
    size_t len, done; /* payload bytes consumed */
    int op, dtype;
    sr_header hdr;
    size_t hdr_have, payload_have;
    int checked;           /* the payload in staging has passed its checksum */
    int held;              /* ... and waits for `feed` to send the bytes it will be added into */
    sendstate *feed;       /* in place: this lane sends the buffer it adds into, so an add waits
                              until those bytes are sent (both ends of an exchange add in place) */
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
        if (s->frame_off == s->frame_len) {
            __atomic_store_n(&s->sent, s->framed, __ATOMIC_SEQ_CST);
            uint64_t one = 1;
            if (s->progress_fd >= 0 && __atomic_load_n(&s->watched, __ATOMIC_SEQ_CST) &&
                write(s->progress_fd, &one, sizeof one) < 0) { /* an eventfd write cannot fail here */
            }
        }
    }
}

/* In place: the frame in staging may be added only once `feed` has sent the bytes it covers. */
static int feed_ready(recvstate *r) {
    if (!r->feed)
        return 1;
    size_t need = r->done + r->hdr.length;
    if (__atomic_load_n(&r->feed->sent, __ATOMIC_SEQ_CST) >= need)
        return 1;
    __atomic_store_n(&r->feed->watched, 1, __ATOMIC_SEQ_CST); /* then look again: no lost wakeup */
    return __atomic_load_n(&r->feed->sent, __ATOMIC_SEQ_CST) >= need;
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
        if (!r->checked && sr_checksum_bytes(dst, r->hdr.length) != r->hdr.payload_sum)
            return sr_fail(err, SR_ECORRUPT, p->peer_rank, "corrupted payload in frame %llu from rank %d",
                        (unsigned long long)r->hdr.seq, p->peer_rank);
        r->checked = 1;
        if ((r->held = !feed_ready(r)))
            return 0; /* the caller waits for the send's progress, not for more data */
        r->checked = 0;
        if (r->op == SR_OP_ADD)
            sr_reduce_add(r->buf + r->done, dst, r->hdr.length, r->dtype);
        r->done += r->hdr.length;
        r->hdr_have = 0;
        p->rx_seq++;
        p->stats[1]++;
        p->stats[3] += r->hdr.length;
        /* While frames keep coming, ack every window/4 of them; the caller flushes the rest
         * before it sleeps, so a sender never waits on an ack we hold. */
        uint32_t batch = p->window / 4 ? p->window / 4 : 1;
        int rc = p->rx_seq - p->rx_acked >= batch || r->done == r->len ? pump_ack_out(p, err) : 0;
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

#define SR_CANCELED 100 /* internal: another group of the call failed first */
#define SR_MAX_GROUPS (2 * SR_MAX_LANES)

/* The sends to one peer (rx = 0) or the receives from one (rx = 1): lane bitmasks. */
typedef struct sr_group {
    sr_peer *peer;
    int rx;
    unsigned sends, recvs;
    size_t frames;
    int rc, stamp; /* the outcome; stamp orders the failures */
    sr_error err;
} sr_group;

typedef struct sr_call {
    sendstate s[SR_MAX_LANES];
    recvstate r[SR_MAX_LANES];
    int n, timeout_ms;
    int64_t deadline;
    int cancel_fd; /* eventfd raised by the first group to fail; -1 on the caller's thread alone */
    sr_group g[SR_MAX_GROUPS];
    int ngroups, failures;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running; /* groups still out on workers */
} sr_call;

/* Drive the sends in lane mask `sends` and the receives in `recvs` until they are done, the
 * deadline passes, or (on a worker) another group fails. Returns 0 or -code with err filled. */
static int run_lanes(sr_call *c, unsigned sends, unsigned recvs, sr_error *err) {
    sendstate *s = c->s;
    recvstate *r = c->r;
    int n = c->n;
    for (;;) {
        int rc, finished = 1;
        for (int i = 0; i < n; i++) {
            if (!(sends >> i & 1u) || !s[i].peer || send_done(&s[i]) || send_waits(s, i))
                continue;
            /* Acks of finished sends wait for the next call (or the close). */
            if ((rc = pump_acks(s[i].peer, err)) || (rc = pump_send(&s[i], err)))
                return rc;
        }
        for (int i = 0; i < n; i++) {
            if (!(recvs >> i & 1u))
                continue;
            uint64_t drained;
            if (r[i].held && r[i].feed->progress_fd >= 0 && read(r[i].feed->progress_fd, &drained, sizeof drained) < 0) {
                /* nothing to drain: EAGAIN */
            }
            if (r[i].done < r[i].len && !recv_waits(r, i) && (rc = pump_recv(&r[i], err)))
                return rc;
            if (r[i].peer && (rc = pump_ack_out(r[i].peer, err)))
                return rc;
        }
        for (int i = 0; i < n; i++)
            if ((sends >> i & 1u && !send_done(&s[i])) ||
                (recvs >> i & 1u && (r[i].done < r[i].len || acks_owed(r[i].peer))))
                finished = 0;
        if (finished)
            return 0;
        int64_t left = c->deadline - now_ms();
        if (left <= 0) {
            for (int i = 0; i < n; i++)
                if (recvs >> i & 1u && r[i].done < r[i].len)
                    return sr_fail(err, SR_ETIMEOUT, r[i].peer->peer_rank,
                                   "timed out after %d ms waiting for data from rank %d (%zu of %zu bytes)",
                                   c->timeout_ms, r[i].peer->peer_rank, r[i].done, r[i].len);
            for (int i = 0; i < n; i++)
                if (sends >> i & 1u && !send_done(&s[i]))
                    return sr_fail(err, SR_ETIMEOUT, s[i].peer->peer_rank,
                                   "timed out after %d ms sending to (window full, no ack from) rank %d",
                                   c->timeout_ms, s[i].peer->peer_rank);
            int i = 0;
            while (!(recvs >> i & 1u && acks_owed(r[i].peer)))
                i++;
            return sr_fail(err, SR_ETIMEOUT, r[i].peer->peer_rank, "timed out after %d ms acking rank %d",
                           c->timeout_ms, r[i].peer->peer_rank);
        }
        struct pollfd fds[3 * SR_MAX_LANES + 1];
        int nfds = 0;
        for (int i = 0; i < n; i++) {
            sr_peer *to = s[i].peer, *from = r[i].peer;
            if (sends >> i & 1u && to && !send_done(&s[i])) {
                /* Wake for acks only when the window is full: until then they can wait. */
                int open = to->tx_seq - to->tx_acked < to->window;
                short ev = open ? 0 : POLLIN;
                if (!send_waits(s, i) && (s[i].frame_off < s[i].frame_len || open))
                    ev |= POLLOUT;
                want_fd(fds, &nfds, to->tx_fd, ev);
            }
            if (!(recvs >> i & 1u))
                continue;
            int reading = r[i].done < r[i].len && !recv_waits(r, i) && !r[i].held;
            if (r[i].held && r[i].feed->progress_fd >= 0)
                want_fd(fds, &nfds, r[i].feed->progress_fd, POLLIN);
            if (reading || acks_owed(from))
                want_fd(fds, &nfds, from->rx_fd, (short)((reading ? POLLIN : 0) | (acks_owed(from) ? POLLOUT : 0)));
        }
        if (c->cancel_fd >= 0)
            fds[nfds++] = (struct pollfd){.fd = c->cancel_fd, .events = POLLIN};
        int got = poll(fds, (nfds_t)nfds, (int)left);
        if (got < 0 && errno != EINTR)
            return sr_fail(err, SR_EIO, -1, "poll: %s", strerror(errno));
        if (got > 0 && c->cancel_fd >= 0 && fds[nfds - 1].revents)
            return -SR_CANCELED;
    }
}

/* Run group gi; a failure is stamped, and one that is not a timeout (the others reach the
 * same deadline by themselves) ends the call's other groups. */
static void run_group(sr_call *c, int gi) {
    sr_group *g = &c->g[gi];
    g->rc = run_lanes(c, g->sends, g->recvs, &g->err);
    if (g->rc && g->rc != -SR_CANCELED && g->rc != -SR_ETIMEOUT) {
        g->stamp = __atomic_fetch_add(&c->failures, 1, __ATOMIC_SEQ_CST);
        uint64_t one = 1;
        if (write(c->cancel_fd, &one, sizeof one) < 0) { /* an eventfd write cannot fail here */
        }
    }
}

static void *worker_main(void *arg) {
    sr_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->call && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (!w->call)
            break;
        sr_call *c = w->call;
        int gi = w->group;
        pthread_mutex_unlock(&w->mu);
        run_group(c, gi);
        pthread_mutex_lock(&w->mu);
        w->call = NULL; /* idle again before the caller can see the call finish */
        pthread_mutex_unlock(&w->mu);
        pthread_mutex_lock(&c->mu);
        if (--c->running == 0)
            pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu); /* the call may be gone from here on */
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* The peer's tx (rx = 0) or rx worker, started on first use with every signal blocked (they
 * belong to the caller's threads); NULL if it cannot be started. */
static sr_worker *peer_worker(sr_peer *p, int rx) {
    if (p->workers_pid != getpid()) { /* first use, or a forked child: its parent's threads are not here */
        p->workers[0] = p->workers[1] = NULL;
        p->workers_pid = getpid();
    }
    if (p->workers[rx])
        return p->workers[rx];
    sr_worker *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&w->thread, NULL, worker_main, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return NULL;
    }
    return p->workers[rx] = w;
}

static void worker_stop(sr_worker *w) {
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

/* Split the call into groups, receives first (so a timeout names the data we waited for). */
static void make_groups(sr_call *c) {
    c->ngroups = 0;
    for (int rx = 1; rx >= 0; rx--)
        for (int i = 0; i < c->n; i++) {
            sr_peer *p = rx ? c->r[i].peer : c->s[i].peer;
            size_t len = rx ? c->r[i].len : c->s[i].len;
            if (!p)
                continue;
            int gi = 0;
            while (gi < c->ngroups && !(c->g[gi].peer == p && c->g[gi].rx == rx))
                gi++;
            if (gi == c->ngroups)
                c->g[c->ngroups++] = (sr_group){.peer = p, .rx = rx};
            if (rx)
                c->g[gi].recvs |= 1u << i;
            else
                c->g[gi].sends |= 1u << i;
            c->g[gi].frames += (len + p->slot_bytes - 1) / p->slot_bytes;
        }
}

/* Close the call's eventfds; the call can then still run on the caller's thread alone. */
static void close_fds(sr_call *c) {
    for (int i = 0; i < c->n; i++)
        if (c->s[i].progress_fd >= 0) {
            close(c->s[i].progress_fd);
            c->s[i].progress_fd = -1;
        }
    close(c->cancel_fd);
    c->cancel_fd = -1;
}

/* Run the groups on the caller's thread and the peers' workers. Returns 1 if the workers
 * could not be had (the caller then runs the call alone), else 0 with the outcome in c->g. */
static int run_parallel(sr_call *c) {
    sr_worker *w[SR_MAX_GROUPS];
    for (int gi = 1; gi < c->ngroups; gi++)
        if (!(w[gi] = peer_worker(c->g[gi].peer, c->g[gi].rx)))
            return 1;
    c->cancel_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->cancel_fd < 0)
        return 1;
    for (int i = 0; i < c->n; i++)
        if (c->r[i].feed && (c->s[i].progress_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
            close_fds(c);
            return 1;
        }
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&c->mu, NULL);
    c->running = c->ngroups - 1;
    for (int gi = 1; gi < c->ngroups; gi++) {
        pthread_mutex_lock(&w[gi]->mu);
        w[gi]->call = c;
        w[gi]->group = gi;
        pthread_cond_signal(&w[gi]->cv);
        pthread_mutex_unlock(&w[gi]->mu);
    }
    run_group(c, 0);
    /* Every group ends by its deadline; past it (plus a second) they are told to stop. */
    pthread_mutex_lock(&c->mu);
    while (c->running) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += 1;
        if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) == ETIMEDOUT && now_ms() > c->deadline + 1000) {
            uint64_t one = 1;
            if (write(c->cancel_fd, &one, sizeof one) < 0) {
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    close_fds(c);
    return 0;
}

/* The call's error: the first real failure, or, if every failure was a timeout, that of the
 * first group (receives come first). */
static int call_outcome(const sr_call *c, sr_error *err) {
    const sr_group *pick = NULL;
    for (int gi = 0; gi < c->ngroups; gi++) {
        const sr_group *g = &c->g[gi];
        if (!g->rc || g->rc == -SR_CANCELED)
            continue;
        int timeout = g->rc == -SR_ETIMEOUT, pick_timeout = pick && pick->rc == -SR_ETIMEOUT;
        if (!pick || (pick_timeout && !timeout) || (timeout == pick_timeout && !timeout && g->stamp < pick->stamp))
            pick = g;
    }
    if (!pick)
        return 0;
    if (err)
        *err = pick->err;
    return pick->rc;
}

/* Run n lanes at once (a ring step moving two halves in opposite directions is two), each
 * sending to its `to` while receiving (copy or add) from its `from`, within timeout_ms.
 * Returns 0 or -code with err filled. */
int sr_transfer_lanes(const sr_lane *lanes, int n, int op, int dtype, int timeout_ms, sr_error *err) {
    if (n < 1 || n > SR_MAX_LANES || (op == SR_OP_ADD && dtype != SR_F32 && dtype != SR_F16 && dtype != SR_BF16))
        return sr_fail(err, SR_EARG, -1, "invalid transfer arguments");
    sr_call c = {.n = n, .timeout_ms = timeout_ms, .deadline = now_ms() + timeout_ms, .cancel_fd = -1};
    for (int i = 0; i < n; i++) {
        const sr_lane *l = &lanes[i];
        if ((!l->to && l->slen) || (!l->from && l->rlen))
            return sr_fail(err, SR_EARG, -1, "invalid transfer arguments");
        c.s[i] = (sendstate){.peer = l->to, .buf = l->sbuf, .len = l->to ? l->slen : 0, .progress_fd = -1};
        c.r[i] = (recvstate){.peer = l->from, .buf = l->rbuf, .len = l->from ? l->rlen : 0, .op = op, .dtype = dtype};
        if (op == SR_OP_ADD && l->to && l->from && l->sbuf == l->rbuf && l->slen == l->rlen)
            c.r[i].feed = &c.s[i];
    }
    make_groups(&c);
    size_t most = 0;
    for (int gi = 0; gi < c.ngroups; gi++)
        most = c.g[gi].frames > most ? c.g[gi].frames : most;
    if (c.ngroups > 1 && most > 1 && !run_parallel(&c))
        return call_outcome(&c, err);
    unsigned all = (1u << n) - 1;
    return run_lanes(&c, all, all, err);
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
