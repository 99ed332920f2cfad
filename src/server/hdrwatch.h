/*
 * hdrwatch.h — the whole-header deadline (issue 42): a request's line and
 * headers must all come within the header timeout, however they trickle.
 *
 * libmicrohttpd's connection timeout counts per pause: a client that sends
 * one byte every 2 s under a 3 s timeout keeps its connection forever, and
 * 130 such connections from one address held all of its 128 and locked its
 * normal requests out (behind a proxy: every client's). The watch keeps one
 * record per connection, from accept: awaiting its headers since t0 (the
 * accept, or the request line of a later request on a kept-alive
 * connection), reading a request, or idle between requests (bounded by the
 * server's own idle timeout). A thread looks every quarter second and shuts
 * down the socket of every connection that has awaited its headers longer
 * than the deadline; libmicrohttpd then sees the connection end and closes
 * it.
 *
 * A record holds the connection's own socket descriptor: libmicrohttpd
 * tells a connection's end (MHD_CONNECTION_NOTIFY_CLOSED, which removes the
 * record under the watch's mutex) before it closes the socket (daemon.c,
 * thread_main_handle_connection and the accept's cleanup path), and the
 * watch shuts sockets down only under that mutex, so it never reaches a
 * descriptor number another connection took after a close. (A dup() per
 * connection would have doubled the descriptors libmicrohttpd's select()
 * must fit below FD_SETSIZE, server.h.)
 *
 * A kept-alive connection idle between requests is cut once it has idled
 * the server's idle timeout in all (libmicrohttpd's resets with every byte:
 * a request line trickled after a first request kept the connection open
 * indefinitely).
 *
 * The per-address cap is kept here too: a connection beyond its address's
 * cap takes the place of that address's oldest connection still awaiting
 * its headers, or else its oldest idle one (cut at once), and is itself cut
 * only when every one of them is in a request. So connections that trickle their headers can never lock
 * their address's (a proxy's: every client's) normal requests out.
 *
 * Thread model: start/stop on one thread; open, the phase calls and close
 * from the connections' threads (one record is only changed by its own
 * connection's thread, under the watch's mutex); the watch thread reads the
 * records under the same mutex.
 */
#ifndef KS_HDRWATCH_H
#define KS_HDRWATCH_H

#include <stdbool.h>
#include <stdint.h>

typedef struct ks_hdrwatch ks_hdrwatch;

/* One connection's record. over_cap: the server's own mark (a connection
 * beyond max_connections, answered 503), kept here because the record is
 * the connection's socket context. */
typedef struct ks_hdrconn {
    bool over_cap;
    unsigned char addr[16]; /* the client's address (4 or 16 bytes) */
    int addr_len;
    int fd;                 /* the connection's socket (not ours to close), -1: cut or not watched */
    int phase;              /* 0 awaiting headers, 1 in a request, 2 idle */
    double t0;              /* ms, when phase 0 (or 2) began */
    struct ks_hdrconn *prev, *next;
} ks_hdrconn;

/* Starts the watch thread: deadline_s > 0; idle_s: the most a connection
 * idles between requests in all (0: no bound but libmicrohttpd's);
 * per_addr: the connections one address may hold (0: no cap). KS_ENOMEM /
 * KS_EIO. */
int ks_hdrwatch_start(unsigned deadline_s, unsigned idle_s, int per_addr, ks_hdrwatch **out);
/* Stops and joins the thread; frees what is left. NULL: no-op. */
void ks_hdrwatch_stop(ks_hdrwatch *w);

/* A new connection on socket fd from address addr (addr_len bytes; 0: not
 * known), awaiting its headers from now. Its address at the cap: the oldest
 * of the address's connections awaiting headers is cut for it, or when
 * there is none, this one. NULL only when out of memory. */
ks_hdrconn *ks_hdrwatch_open(ks_hdrwatch *w, int fd, const void *addr, int addr_len);
/* A request line arrived: after an idle wait, the deadline starts now. */
void ks_hdrwatch_request_line(ks_hdrwatch *w, ks_hdrconn *c);
/* The headers are in: the request is read under the body's own timeout. */
void ks_hdrwatch_headers(ks_hdrwatch *w, ks_hdrconn *c);
/* The request was answered: the connection idles until its next request line. */
void ks_hdrwatch_done(ks_hdrwatch *w, ks_hdrconn *c);
/* The connection closed: the record is freed. NULL: no-op. */
void ks_hdrwatch_close(ks_hdrwatch *w, ks_hdrconn *c);

/* Connections cut by the deadline so far. */
uint64_t ks_hdrwatch_cut(const ks_hdrwatch *w);

#endif
