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
 * calls (the latency path) stay on the caller's thread.
 *
 * Liveness (sr_keeper, at the end): the ack direction of each cable (we write on rx, read on
 * tx) also carries heartbeats and dead-peer verdicts. It is shared by whichever call runs and
 * the keeper thread, under two small locks (in_mu: reading tx; out_mu: writing rx), so a link
 * is watched whether or not a collective runs; the DATA direction stays the call's alone. */
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

#include "sr_layout.h"
#include "sr_wire.h"

#define SR_MAX_STRIPES 4 /* connections per link (sr_peer_stripe) */

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
    pthread_mutex_t in_mu, out_mu; /* the ack direction: reading it (tx_fd), writing it (rx_fd) */
    unsigned char ctl_in[SR_HEADER_BYTES + SR_DEAD_BYTES]; /* a control frame being read */
    size_t ctl_in_have;
    unsigned char out[4 * (SR_HEADER_BYTES + SR_DEAD_BYTES)]; /* control frames being written */
    size_t out_off, out_len;
    int event_fd;          /* raised when the keeper consumed acks a call may be waiting for */
    int64_t last_heard_ms; /* monotonic: the last bytes from the peer, either direction (atomic) */
    int64_t last_sent_ms;  /* monotonic: the last bytes we wrote on the ack direction */
    int ctl_closed;        /* the ack direction reached its end: the peer closed or reset it */
    int peer_left;         /* the peer said BYE first: its close is no verdict */
    int aborted;           /* we shut the link down ourselves (sr_peer_abort) */
    uint32_t addr;         /* the peer's IPv4 address on this cable (network order; sr_peer_describe) */
    int cage;
    struct sr_keeper *keeper; /* the thread that watches this link, if any */
    unsigned char *staging; /* one slot: a DATA payload is checked here before it is added */
    uint64_t stats[6];      /* frames tx, frames rx, bytes tx, bytes rx, acks tx, acks rx */
    sr_worker *workers[2];  /* the tx and rx side's threads, started on first use */
    pid_t workers_pid;      /* ... by this process (a forked child has none of them) */
    /* Striping (sr_peer_stripe): a link's further connections to the same neighbour. */
    struct sr_peer *link;                      /* a stripe: the link it belongs to (keeper, verdicts) */
    struct sr_peer *stripe[SR_MAX_STRIPES - 1]; /* a link: its further connections, in order */
    int nstripes;
    size_t stripe_min; /* a link: the fewest bytes a lane's send or receive is striped from */
} sr_peer;

/* The link a handle belongs to: itself, or the link whose stripe it is. */
static const sr_peer *link_of(const sr_peer *p) { return p && p->link ? p->link : p; }

static void worker_stop(sr_worker *w);

static int pump_acks(sr_peer *p, sr_error *err);
static int64_t now_ms(void);
static int keeper_after_failure(sr_peer *p, int rc, sr_error *err);
static int keeper_check(const sr_peer *p, sr_error *err);
static int keeper_dead_fd(const sr_peer *p);
static int keeper_heard_dead(sr_peer *p, const sr_dead *d, sr_error *err);
static void send_control(sr_peer *p, uint8_t kind, const void *payload, uint32_t len, int ms);

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

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* How long a call run on the caller's thread alone (the small-message path) polls its sockets
 * without sleeping before it sleeps in poll(): a sleeping thread's wake-up is a large part of a
 * small exchange on loopback. SPARKRING_ENGINE_SPIN_US, read once (default 50; 0: never spin). */
static int64_t sr_spin_us(void) {
    static int64_t spin = -1;
    if (spin < 0) {
        const char *env = getenv("SPARKRING_ENGINE_SPIN_US");
        long v = env && *env ? strtol(env, NULL, 10) : 50;
        spin = v < 0 ? 0 : v > 10000 ? 10000 : v;
    }
    return spin;
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
    p->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&p->in_mu, NULL);
    pthread_mutex_init(&p->out_mu, NULL);
    p->last_heard_ms = p->last_sent_ms = now_ms();
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
    while (__atomic_load_n(&p->tx_acked, __ATOMIC_ACQUIRE) < p->tx_seq) {
        sr_error ignored;
        int64_t left = deadline - now_ms();
        if (left <= 0 || pump_acks(p, &ignored) || __atomic_load_n(&p->tx_acked, __ATOMIC_ACQUIRE) == p->tx_seq)
            break;
        struct pollfd f = {.fd = p->tx_fd, .events = POLLIN};
        poll(&f, 1, (int)left);
    }
    if (linger_ms > 0) /* a clean close: tell the peer, so it is no verdict on us */
        send_control(p, SR_KIND_BYE, NULL, 0, (int)(deadline - now_ms() > 100 ? deadline - now_ms() : 100));
    if (p->workers_pid == getpid())
        for (int side = 0; side < 2; side++)
            worker_stop(p->workers[side]);
    shutdown(p->tx_fd, SHUT_WR);
    close(p->tx_fd);
    if (p->rx_fd != p->tx_fd)
        close(p->rx_fd);
    if (p->event_fd >= 0)
        close(p->event_fd);
    pthread_mutex_destroy(&p->in_mu);
    pthread_mutex_destroy(&p->out_mu);
    free(p->staging);
    free(p);
}

/* Name the peer for dead-peer verdicts: its IPv4 address on this cable and the cable's cage. */
void sr_peer_describe(sr_peer *p, uint32_t addr_be, int cage) {
    p->addr = addr_be;
    p->cage = cage;
}

void sr_peer_stats(const sr_peer *p, uint64_t out[6]) { memcpy(out, p->stats, sizeof p->stats); }

/* Make `extra` (another pair of connections to the same neighbour) link's next stripe: a lane
 * whose send or receive on the link moves at least min_bytes is then cut into one part per
 * connection, and the parts move at once, each on its own threads. Both ends must stripe
 * alike (the rendezvous checks the connection count). 0, or -SR_EARG naming what is wrong. */
int sr_peer_stripe(sr_peer *link, sr_peer *extra, uint64_t min_bytes, sr_error *err) {
    if (!link || !extra || link == extra || link->link || extra->link || extra->nstripes)
        return sr_fail(err, SR_EARG, -1, "a stripe joins a link that is not itself a stripe, once");
    if (link->nstripes == SR_MAX_STRIPES - 1)
        return sr_fail(err, SR_EARG, -1, "a link has at most %d connections", SR_MAX_STRIPES);
    if (extra->peer_rank != link->peer_rank || extra->my_rank != link->my_rank || extra->slot_bytes != link->slot_bytes ||
        extra->window != link->window)
        return sr_fail(err, SR_EARG, extra->peer_rank, "a stripe must join a link to the same rank with its slot and window");
    if (min_bytes < 1)
        return sr_fail(err, SR_EARG, -1, "stripe_min_bytes must be positive");
    extra->link = link;
    link->stripe[link->nstripes++] = extra;
    link->stripe_min = (size_t)min_bytes;
    return 0;
}

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
    /* The ack direction also carries heartbeats and verdicts. */
    int kind_ok = h->kind == kind || (kind == SR_KIND_ACK && (h->kind == SR_KIND_HEARTBEAT || h->kind == SR_KIND_DEAD ||
                                                              h->kind == SR_KIND_BYE));
    if (h->version != SR_WIRE_VERSION || !kind_ok || h->src_rank != p->peer_rank || h->dst_rank != p->my_rank)
        return sr_fail(err, SR_EPROTO, p->peer_rank,
                    "unexpected frame from rank %d: version %u kind %u src %u dst %u (expected %d, %u, %d, %d)",
                    p->peer_rank, h->version, h->kind, h->src_rank, h->dst_rank, SR_WIRE_VERSION, kind,
                    p->peer_rank, p->my_rank);
    return 0;
}

static void touch(sr_peer *p) { __atomic_store_n(&p->last_heard_ms, now_ms(), __ATOMIC_RELAXED); }

static void raise_fd(int fd) {
    uint64_t one = 1;
    if (fd >= 0 && write(fd, &one, sizeof one) < 0) { /* an eventfd write cannot fail here */
    }
}

/* Read the ack direction on tx until the socket would block: ACKs, heartbeats, verdicts. The
 * caller holds in_mu. *acked is set when an ACK moved the window. */
static int read_control(sr_peer *p, int *acked, sr_error *err) {
    for (;;) {
        size_t want = SR_HEADER_BYTES;
        sr_header h;
        if (p->ctl_in_have >= SR_HEADER_BYTES) {
            memcpy(&h, p->ctl_in, sizeof h);
            want += h.length;
        }
        ssize_t n = recv(p->tx_fd, p->ctl_in + p->ctl_in_have, want - p->ctl_in_have, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0 || errno == ECONNRESET)
                p->ctl_closed = 1;
            return io_fail(err, p, "waited for an ack from", n);
        }
        touch(p);
        p->ctl_in_have += (size_t)n;
        if (p->ctl_in_have < SR_HEADER_BYTES)
            continue;
        memcpy(&h, p->ctl_in, sizeof h);
        if (p->ctl_in_have == SR_HEADER_BYTES) { /* the header is complete: check it before its payload */
            int rc = check_header(&h, p, SR_KIND_ACK, err);
            if (rc)
                return rc;
            if (h.length != (h.kind == SR_KIND_DEAD ? SR_DEAD_BYTES : 0u))
                return sr_fail(err, SR_EPROTO, p->peer_rank, "control frame kind %u from rank %d has %u bytes",
                               h.kind, p->peer_rank, h.length);
        }
        if (p->ctl_in_have < SR_HEADER_BYTES + h.length)
            continue;
        p->ctl_in_have = 0;
        if (h.kind == SR_KIND_ACK) {
            if (h.seq <= p->tx_acked || h.seq > p->tx_seq)
                return sr_fail(err, SR_ESEQ, p->peer_rank, "ack %llu from rank %d out of sequence (acked %llu, sent %llu)",
                               (unsigned long long)h.seq, p->peer_rank, (unsigned long long)p->tx_acked,
                               (unsigned long long)p->tx_seq);
            __atomic_store_n(&p->tx_acked, h.seq, __ATOMIC_RELEASE);
            p->stats[5]++;
            *acked = 1;
        } else if (h.kind == SR_KIND_DEAD) {
            sr_dead d;
            memcpy(&d, p->ctl_in + SR_HEADER_BYTES, sizeof d);
            if (sr_checksum_bytes(&d, sizeof d) != h.payload_sum)
                return sr_fail(err, SR_ECORRUPT, p->peer_rank, "corrupted verdict from rank %d", p->peer_rank);
            int rc = keeper_heard_dead(p, &d, err);
            if (rc)
                return rc;
        } else if (h.kind == SR_KIND_BYE) {
            __atomic_store_n(&p->peer_left, 1, __ATOMIC_RELEASE);
        } /* a heartbeat only says the peer is there: touch() above */
    }
}

/* Read what the peer sent on the ack direction (the calling thread's turn at it). */
static int pump_acks(sr_peer *p, sr_error *err) {
    int acked = 0;
    pthread_mutex_lock(&p->in_mu);
    int rc = read_control(p, &acked, err);
    pthread_mutex_unlock(&p->in_mu);
    return rc;
}

/* Append one control frame to the pending output (the caller holds out_mu); 0 if it is full. */
static int queue_out(sr_peer *p, uint8_t kind, uint64_t seq, const void *payload, uint32_t len) {
    if (p->out_off == p->out_len)
        p->out_off = p->out_len = 0;
    if (p->out_len + SR_HEADER_BYTES + len > sizeof p->out)
        return 0;
    sr_header h;
    sr_header_fill(&h, kind, (uint16_t)p->my_rank, (uint16_t)p->peer_rank, seq, payload, len);
    memcpy(p->out + p->out_len, &h, sizeof h);
    if (len)
        memcpy(p->out + p->out_len + SR_HEADER_BYTES, payload, len);
    p->out_len += SR_HEADER_BYTES + len;
    return 1;
}

/* Write the pending control frames on rx until done or it would block (the caller holds
 * out_mu). `ack`: first queue an ACK of the latest consumed count (a call's receives);
 * `heartbeat_ms` > 0: queue a heartbeat when nothing went for that long (the keeper). A sender
 * may finish and close before reading our last ack; that is not an error here (a later receive
 * from it fails instead). */
static int flush_out(sr_peer *p, int ack, int heartbeat_ms, sr_error *err) {
    while (!p->rx_gone) {
        if (p->out_off == p->out_len) {
            if (ack && p->rx_acked != p->rx_seq) {
                queue_out(p, SR_KIND_ACK, p->rx_seq, NULL, 0);
                p->rx_acked = p->rx_seq;
                p->stats[4]++;
            } else if (heartbeat_ms > 0 && now_ms() - p->last_sent_ms >= heartbeat_ms) {
                queue_out(p, SR_KIND_HEARTBEAT, 0, NULL, 0);
            } else {
                return 0;
            }
        }
        ssize_t n = send(p->rx_fd, p->out + p->out_off, p->out_len - p->out_off, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            p->rx_gone = 1;
            p->out_off = p->out_len;
            return 0;
        }
        if (n <= 0)
            return io_fail(err, p, "acked", n);
        p->out_off += (size_t)n;
        p->last_sent_ms = now_ms();
    }
    return 0;
}

/* Write the pending ACK (the latest consumed count) on rx until done or it would block. */
static int pump_ack_out(sr_peer *p, sr_error *err) {
    pthread_mutex_lock(&p->out_mu);
    int rc = flush_out(p, 1, 0, err);
    pthread_mutex_unlock(&p->out_mu);
    return rc;
}

/* Queue one control frame and write it out within `ms` (the caller holds no lock). */
static void send_control(sr_peer *p, uint8_t kind, const void *payload, uint32_t len, int ms) {
    int64_t deadline = now_ms() + ms;
    sr_error ignored;
    pthread_mutex_lock(&p->out_mu);
    int queued = 0;
    while (!p->rx_gone && now_ms() < deadline) {
        if (!queued)
            queued = queue_out(p, kind, 0, payload, len);
        if (flush_out(p, 0, 0, &ignored) || (queued && p->out_off == p->out_len))
            break;
        struct pollfd f = {.fd = p->rx_fd, .events = POLLOUT};
        poll(&f, 1, 10);
    }
    pthread_mutex_unlock(&p->out_mu);
}

static int send_done(const sendstate *s) { return s->framed == s->len && s->frame_off == s->frame_len; }

static int pump_send(sendstate *s, sr_error *err) {
    sr_peer *p = s->peer;
    for (;;) {
        if (s->frame_off == s->frame_len) {
            if (s->framed == s->len || p->tx_seq - __atomic_load_n(&p->tx_acked, __ATOMIC_ACQUIRE) >= p->window)
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

static int acks_owed(sr_peer *p) {
    if (!p || p->rx_gone)
        return 0;
    pthread_mutex_lock(&p->out_mu);
    int owed = p->out_off < p->out_len;
    pthread_mutex_unlock(&p->out_mu);
    return owed;
}

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
#define SR_CALL_LANES (SR_MAX_LANES * SR_MAX_STRIPES) /* a call's lanes once striped */
#define SR_MAX_GROUPS (2 * SR_CALL_LANES)

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
    sendstate s[SR_CALL_LANES];
    recvstate r[SR_CALL_LANES];
    int n, timeout_ms;
    int64_t deadline;
    int64_t spin_until_us; /* until then a wait polls without sleeping (sr_spin_us) */
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
        for (int i = 0; i < n; i++) /* a peer declared dead anywhere on the ring ends the call */
            if ((sends >> i & 1u && (rc = keeper_check(s[i].peer, err))) ||
                (recvs >> i & 1u && (rc = keeper_check(r[i].peer, err))))
                return rc;
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
        struct pollfd fds[6 * SR_CALL_LANES + 1];
        int nfds = 0;
        for (int i = 0; i < n; i++) {
            sr_peer *to = s[i].peer, *from = r[i].peer;
            if (sends >> i & 1u && to && !send_done(&s[i])) {
                /* Wake for acks only when the window is full: until then they can wait. The
                 * keeper may read them first: it raises the peer's event_fd then. */
                int open = to->tx_seq - __atomic_load_n(&to->tx_acked, __ATOMIC_ACQUIRE) < to->window;
                short ev = open ? 0 : POLLIN;
                if (!send_waits(s, i) && (s[i].frame_off < s[i].frame_len || open))
                    ev |= POLLOUT;
                want_fd(fds, &nfds, to->tx_fd, ev);
                if (!open && to->event_fd >= 0)
                    want_fd(fds, &nfds, to->event_fd, POLLIN);
            }
            /* A verdict (never drained) wakes every call at once. */
            if (sends >> i & 1u && keeper_dead_fd(to) >= 0)
                want_fd(fds, &nfds, keeper_dead_fd(to), POLLIN);
            if (recvs >> i & 1u && keeper_dead_fd(from) >= 0)
                want_fd(fds, &nfds, keeper_dead_fd(from), POLLIN);
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
        int spinning = now_us() < c->spin_until_us;
        int got = poll(fds, (nfds_t)nfds, spinning ? 0 : (int)left);
        if (got < 0 && errno != EINTR)
            return sr_fail(err, SR_EIO, -1, "poll: %s", strerror(errno));
        if (got > 0 && c->cancel_fd >= 0 && fds[nfds - 1].revents)
            return -SR_CANCELED;
        for (int i = 0; got > 0 && i < n; i++) { /* acks the keeper read: drain its wake-up */
            uint64_t drained;
            if (sends >> i & 1u && s[i].peer && s[i].peer->event_fd >= 0 &&
                read(s[i].peer->event_fd, &drained, sizeof drained) < 0) { /* nothing to drain: EAGAIN */
            }
        }
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

/* How many connections `len` bytes on link p are cut over: all of them from its stripe_min. */
static int stripes_for(const sr_peer *p, size_t len) {
    return p && p->nstripes && len >= p->stripe_min ? p->nstripes + 1 : 1;
}

/* Part j of k of buf[len]: equal parts rounded up to 64 bytes (whole elements of every dtype),
 * the last one shorter. Both ends of a link cut a length the same way. */
static size_t stripe_part(size_t len, int j, int k, size_t *off) {
    size_t part = ((len + (size_t)k - 1) / (size_t)k + 63) & ~(size_t)63;
    *off = part * (size_t)j < len ? part * (size_t)j : len;
    return len - *off < part ? len - *off : part;
}

/* The lanes as the connections carry them: a striped send or receive becomes one lane part per
 * connection of its link, in connection order, in the place of its lane (so lanes that share a
 * connection still use it in lane order). Returns the number of lanes written to out. */
static int stripe_lanes(const sr_lane *lanes, int n, sr_lane *out) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        const sr_lane *l = &lanes[i];
        sr_peer *to = l->to, *from = l->from;
        int ks = stripes_for(to, l->slen), kr = stripes_for(from, l->rlen);
        for (int j = 0; j < (ks > kr ? ks : kr); j++) {
            sr_lane part = {0};
            size_t off;
            if (j < ks) {
                part.to = j ? to->stripe[j - 1] : to;
                part.slen = stripe_part(l->slen, j, ks, &off);
                part.sbuf = (const unsigned char *)l->sbuf + off;
            }
            if (j < kr) {
                part.from = j ? from->stripe[j - 1] : from;
                part.rlen = stripe_part(l->rlen, j, kr, &off);
                part.rbuf = (unsigned char *)l->rbuf + off;
            }
            out[m++] = part;
        }
    }
    return m;
}

/* Run n lanes at once (a ring step moving two halves in opposite directions is two), each
 * sending to its `to` while receiving (copy or add) from its `from`, within timeout_ms; a lane
 * on a striped link runs over all its connections. Returns 0 or -code with err filled. */
int sr_transfer_lanes(const sr_lane *given, int n, int op, int dtype, int timeout_ms, sr_error *err) {
    if (n < 1 || n > SR_MAX_LANES || (op == SR_OP_ADD && dtype != SR_F32 && dtype != SR_F16 && dtype != SR_BF16))
        return sr_fail(err, SR_EARG, -1, "invalid transfer arguments");
    for (int i = 0; i < n; i++)
        if ((!given[i].to && given[i].slen) || (!given[i].from && given[i].rlen))
            return sr_fail(err, SR_EARG, -1, "invalid transfer arguments");
    sr_lane lanes[SR_CALL_LANES];
    n = stripe_lanes(given, n, lanes);
    sr_call c = {.n = n, .timeout_ms = timeout_ms, .deadline = now_ms() + timeout_ms, .cancel_fd = -1};
    for (int i = 0; i < n; i++) {
        const sr_lane *l = &lanes[i];
        c.s[i] = (sendstate){.peer = l->to, .buf = l->sbuf, .len = l->to ? l->slen : 0, .progress_fd = -1};
        c.r[i] = (recvstate){.peer = l->from, .buf = l->rbuf, .len = l->from ? l->rlen : 0, .op = op, .dtype = dtype};
        if (op == SR_OP_ADD && l->to && l->from && l->sbuf == l->rbuf && l->slen == l->rlen)
            c.r[i].feed = &c.s[i];
    }
    make_groups(&c);
    size_t most = 0;
    for (int gi = 0; gi < c.ngroups; gi++)
        most = c.g[gi].frames > most ? c.g[gi].frames : most;
    unsigned all = (1u << n) - 1;
    sr_error local;
    sr_error *e = err ? err : &local;
    int rc;
    if (c.ngroups > 1 && most > 1 && !run_parallel(&c))
        rc = call_outcome(&c, e);
    else {
        c.spin_until_us = now_us() + sr_spin_us();
        rc = run_lanes(&c, all, all, e);
    }
    if (rc) { /* the peer it names, for the keeper's verdict */
        sr_peer *named = NULL;
        for (int i = 0; i < n && !named; i++) {
            if (c.s[i].peer && c.s[i].peer->peer_rank == e->peer_rank)
                named = c.s[i].peer;
            else if (c.r[i].peer && c.r[i].peer->peer_rank == e->peer_rank)
                named = c.r[i].peer;
        }
        if (!named)
            named = c.s[0].peer ? c.s[0].peer : c.r[0].peer;
        rc = keeper_after_failure((sr_peer *)link_of(named), rc, e);
    }
    return rc;
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
    __atomic_store_n(&p->aborted, 1, __ATOMIC_RELEASE); /* our own close is no verdict on the peer */
    shutdown(p->tx_fd, SHUT_RDWR);
    if (p->rx_fd != p->tx_fd)
        shutdown(p->rx_fd, SHUT_RDWR);
    for (int j = 0; j < p->nstripes; j++)
        sr_peer_abort(p->stripe[j]);
}

/* ---- liveness: the keeper thread ------------------------------------------------------------
 *
 * One per communicator. Every tick it reads each link's ack direction (heartbeats, verdicts,
 * and acks a call has not read yet), sends a heartbeat where nothing went for heartbeat_ms, and
 * judges: a link whose ack direction closed, or that sent nothing for dead_ms, is a dead peer.
 * It runs whether or not a collective does, so a dead neighbour is noticed within dead_ms on
 * an idle ring too (a closed connection at once). The first verdict, its own or one a
 * neighbour sent, is the communicator's: it is sent on to every other neighbour (each rank
 * forwards the first it gets, so it floods the ring once), and every call on these links fails
 * with it, naming the rank that actually failed rather than the neighbour that closed after. */

#define SR_KEEPER_PEERS 4
#define SR_SETTLE_MS 300 /* after a closed link, how long to look for the verdict it may have sent */
#define SR_SEND_VERDICT_MS 500

typedef struct sr_keeper {
    sr_peer *peer[SR_KEEPER_PEERS];
    int n, my_rank, heartbeat_ms, dead_ms;
    pthread_t thread;
    int running, stop;
    int wake_fd; /* ends the thread's poll */
    int dead_fd; /* raised once, when the verdict is known; never drained */
    pthread_mutex_t mu;
    int have; /* the verdict below is set (atomic) */
    sr_dead verdict;
    int via; /* the neighbour that told us, or -1: we saw it ourselves */
} sr_keeper;

static int64_t utc_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int keeper_has(const sr_keeper *k) { return k && __atomic_load_n(&k->have, __ATOMIC_ACQUIRE); }

static int keeper_dead_fd(const sr_peer *p) {
    p = link_of(p);
    return p && p->keeper ? p->keeper->dead_fd : -1;
}

/* The verdict as a call's error: -code with err naming the dead rank. */
static int verdict_error(const sr_keeper *k, sr_error *err) {
    const sr_dead *d = &k->verdict;
    if (k->via < 0)
        return sr_fail(err, d->code, d->dead_rank, "rank %d stopped answering (%s)", d->dead_rank,
                       d->code == SR_ETIMEOUT ? "nothing heard" : "its connection closed");
    return sr_fail(err, d->code, d->dead_rank, "rank %d stopped answering (%s; seen by rank %d, told by rank %d)",
                   d->dead_rank, d->code == SR_ETIMEOUT ? "nothing heard" : "its connection closed", d->reporter,
                   k->via);
}

static int keeper_check(const sr_peer *p, sr_error *err) {
    p = link_of(p);
    if (!p || !keeper_has(p->keeper))
        return 0;
    return verdict_error(p->keeper, err);
}

/* Record the first verdict and pass it on to every neighbour but the dead one and the teller;
 * 1 if this one was the first. */
static int keeper_publish(sr_keeper *k, const sr_dead *d, int via) {
    pthread_mutex_lock(&k->mu);
    int first = !k->have;
    if (first) {
        k->verdict = *d;
        k->via = via;
        __atomic_store_n(&k->have, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&k->mu);
    if (!first)
        return 0;
    for (int i = 0; i < k->n; i++) {
        sr_peer *q = k->peer[i];
        if (q->peer_rank != d->dead_rank && q->peer_rank != via && !__atomic_load_n(&q->aborted, __ATOMIC_ACQUIRE))
            send_control(q, SR_KIND_DEAD, d, SR_DEAD_BYTES, SR_SEND_VERDICT_MS);
    }
    raise_fd(k->dead_fd);
    return 1;
}

/* This rank saw its neighbour p die: `code` SR_ECLOSED or SR_ETIMEOUT. */
static void keeper_saw(sr_keeper *k, sr_peer *p, int code, int64_t silent_ms) {
    sr_dead d = {.dead_rank = (uint16_t)p->peer_rank, .reporter = (uint16_t)k->my_rank, .cage = (uint16_t)p->cage,
                 .code = (uint16_t)code, .addr = p->addr, .silent_ms = (uint32_t)silent_ms, .at_ms = (uint64_t)utc_ms()};
    keeper_publish(k, &d, -1);
}

/* A neighbour's verdict arrived on p's ack direction. */
static int keeper_heard_dead(sr_peer *p, const sr_dead *d, sr_error *err) {
    if (!p->keeper) /* a bare link (the protocol tests): the verdict is the error */
        return sr_fail(err, d->code, d->dead_rank, "rank %d stopped answering (seen by rank %d)", d->dead_rank,
                       d->reporter);
    if (d->dead_rank == p->my_rank) /* about us (a cable cut both ways, say): our own verdict comes */
        return 0;
    keeper_publish(p->keeper, d, p->peer_rank);
    return 0;
}

/* A call failed naming p: the ring's verdict if there is one, or one it may be about to send
 * (a neighbour that saw another rank die tells us before it closes), else this failure, as
 * our own verdict on p when it closed or timed out. */
static int keeper_after_failure(sr_peer *p, int rc, sr_error *err) {
    if (!p || !p->keeper || rc == -SR_CANCELED)
        return rc;
    sr_keeper *k = p->keeper;
    if (!keeper_has(k) && rc == -SR_ECLOSED) {
        int64_t until = now_ms() + SR_SETTLE_MS;
        while (!keeper_has(k) && !p->ctl_closed && now_ms() < until) {
            struct pollfd f = {.fd = p->tx_fd, .events = POLLIN};
            poll(&f, 1, 10);
            sr_error ignored;
            if (pump_acks(p, &ignored) && !keeper_has(k))
                break;
        }
    }
    if (!keeper_has(k) && rc == -SR_ETIMEOUT &&
        now_ms() - __atomic_load_n(&p->last_heard_ms, __ATOMIC_RELAXED) < k->dead_ms) {
        /* The peer still answers our keeper: it is waiting on someone else. That rank's
         * neighbours will say who (within the bound); their verdict is the one to report. */
        struct pollfd f = {.fd = k->dead_fd, .events = POLLIN};
        poll(&f, 1, k->dead_ms);
    }
    if (!keeper_has(k) && (rc == -SR_ECLOSED || rc == -SR_ETIMEOUT) && err->peer_rank == p->peer_rank &&
        !__atomic_load_n(&p->peer_left, __ATOMIC_ACQUIRE))
        keeper_saw(k, p, -rc, now_ms() - __atomic_load_n(&p->last_heard_ms, __ATOMIC_RELAXED));
    return keeper_has(k) ? verdict_error(k, err) : rc;
}

static void keeper_tick(sr_keeper *k) {
    for (int i = 0; i < k->n; i++) {
        sr_peer *p = k->peer[i];
        if (__atomic_load_n(&p->aborted, __ATOMIC_ACQUIRE))
            continue;
        sr_error ignored;
        if (!p->ctl_closed && pthread_mutex_trylock(&p->in_mu) == 0) {
            int acked = 0;
            read_control(p, &acked, &ignored);
            pthread_mutex_unlock(&p->in_mu);
            if (acked)
                raise_fd(p->event_fd);
        }
        if (pthread_mutex_trylock(&p->out_mu) == 0) {
            flush_out(p, 0, k->heartbeat_ms, &ignored);
            pthread_mutex_unlock(&p->out_mu);
        }
        if (keeper_has(k) || __atomic_load_n(&p->peer_left, __ATOMIC_ACQUIRE))
            continue;
        int64_t silent = now_ms() - __atomic_load_n(&p->last_heard_ms, __ATOMIC_RELAXED);
        if (p->ctl_closed)
            keeper_saw(k, p, SR_ECLOSED, silent);
        else if (silent > k->dead_ms)
            keeper_saw(k, p, SR_ETIMEOUT, silent);
    }
}

static void *keeper_main(void *arg) {
    sr_keeper *k = arg;
    int tick = k->heartbeat_ms / 4 < 10 ? 10 : k->heartbeat_ms / 4 > 250 ? 250 : k->heartbeat_ms / 4;
    while (!__atomic_load_n(&k->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd fds[SR_KEEPER_PEERS + 1];
        for (int i = 0; i < k->n; i++) { /* wake at once when a link closes or a verdict comes */
            sr_peer *p = k->peer[i];
            int watch = !p->ctl_closed && !__atomic_load_n(&p->aborted, __ATOMIC_ACQUIRE) &&
                        !__atomic_load_n(&p->peer_left, __ATOMIC_ACQUIRE);
            fds[i] = (struct pollfd){.fd = watch ? p->tx_fd : -1, .events = POLLIN};
        }
        fds[k->n] = (struct pollfd){.fd = k->wake_fd, .events = POLLIN};
        poll(fds, (nfds_t)k->n + 1, tick);
        if (__atomic_load_n(&k->stop, __ATOMIC_ACQUIRE))
            break;
        keeper_tick(k);
        /* A readable link the tick could not read (a call held it) would spin the poll. */
        for (int i = 0; i < k->n; i++)
            if (fds[i].revents && !k->peer[i]->ctl_closed) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
                break;
            }
    }
    return NULL;
}

/* Watch `peers` (a communicator's links): heartbeats every heartbeat_ms, a peer dead after
 * dead_ms of silence. NULL on bad arguments. The peers must outlive the keeper. */
sr_keeper *sr_keeper_new(sr_peer *const *peers, int n, int heartbeat_ms, int dead_ms) {
    if (n < 1 || n > SR_KEEPER_PEERS || heartbeat_ms < 1 || dead_ms <= heartbeat_ms)
        return NULL;
    sr_keeper *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->n = n;
    k->heartbeat_ms = heartbeat_ms;
    k->dead_ms = dead_ms;
    k->via = -1;
    k->my_rank = peers[0]->my_rank;
    k->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    k->dead_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&k->mu, NULL);
    int64_t now = now_ms();
    for (int i = 0; i < n; i++) {
        k->peer[i] = peers[i];
        __atomic_store_n(&peers[i]->last_heard_ms, now, __ATOMIC_RELAXED);
        peers[i]->keeper = k;
    }
    return k;
}

int sr_keeper_start(sr_keeper *k) {
    if (k->running)
        return 0;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* signals belong to the caller's threads */
    int rc = pthread_create(&k->thread, NULL, keeper_main, k);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc)
        return -SR_EIO;
    k->running = 1;
    return 0;
}

/* Stop the thread and let go of the peers (before they are freed). */
void sr_keeper_free(sr_keeper *k) {
    if (!k)
        return;
    if (k->running) {
        __atomic_store_n(&k->stop, 1, __ATOMIC_RELEASE);
        raise_fd(k->wake_fd);
        pthread_join(k->thread, NULL);
    }
    for (int i = 0; i < k->n; i++)
        k->peer[i]->keeper = NULL;
    close(k->wake_fd);
    close(k->dead_fd);
    pthread_mutex_destroy(&k->mu);
    free(k);
}

/* 1 and the verdict (and the neighbour that told us, -1 if we saw it) once there is one. */
int sr_keeper_verdict(sr_keeper *k, sr_dead *out, int *via) {
    pthread_mutex_lock(&k->mu);
    int have = k->have;
    if (have) {
        *out = k->verdict;
        *via = k->via;
    }
    pthread_mutex_unlock(&k->mu);
    return have;
}

/* Test hook: the seconds since each peer was last heard from (to show heartbeats arrive). */
void sr_keeper_silence_ms(const sr_keeper *k, int64_t out[SR_KEEPER_PEERS]) {
    int64_t now = now_ms();
    for (int i = 0; i < k->n; i++)
        out[i] = now - __atomic_load_n(&k->peer[i]->last_heard_ms, __ATOMIC_RELAXED);
}

/* What the Python mirrors of this library's structs are checked against when it loads
 * (sr_layout.h, transport/layout.py). */
static const sr_layout_entry engine_layout[] = {
    SR_LAYOUT_SIZE(sr_error),
    SR_LAYOUT_FIELD(sr_error, code),
    SR_LAYOUT_FIELD(sr_error, peer_rank),
    SR_LAYOUT_FIELD(sr_error, message),
    SR_LAYOUT_SIZE(sr_lane),
    SR_LAYOUT_FIELD(sr_lane, to),
    SR_LAYOUT_FIELD(sr_lane, sbuf),
    SR_LAYOUT_FIELD(sr_lane, slen),
    SR_LAYOUT_FIELD(sr_lane, from),
    SR_LAYOUT_FIELD(sr_lane, rbuf),
    SR_LAYOUT_FIELD(sr_lane, rlen),
    SR_LAYOUT_SIZE(sr_dead),
    SR_LAYOUT_FIELD(sr_dead, dead_rank),
    SR_LAYOUT_FIELD(sr_dead, reporter),
    SR_LAYOUT_FIELD(sr_dead, cage),
    SR_LAYOUT_FIELD(sr_dead, code),
    SR_LAYOUT_FIELD(sr_dead, addr),
    SR_LAYOUT_FIELD(sr_dead, silent_ms),
    SR_LAYOUT_FIELD(sr_dead, at_ms),
    SR_LAYOUT_CONST(SR_MAX_LANES),
    SR_LAYOUT_CONST(SR_KEEPER_PEERS),
    SR_LAYOUT_CONST(SR_MAX_STRIPES),
    SR_LAYOUT_END,
};

const sr_layout_entry *sr_engine_layout(void) { return engine_layout; }
