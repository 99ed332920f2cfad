/*
 * peer.c — see peer.h: what a client's socket says, and the probe that
 * tells a half-closed client from one that is gone.
 */
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include "server/peer.h"

/* KS_PEER_GONE: the connection broke (a reset: POLLHUP/POLLERR, a read error).
 * KS_PEER_EOF: the client will send nothing more — it shut down its sending
 * side and may still read (a half-close), or it closed the socket; TCP
 * tells these apart only when we write. A client that pipelined its next
 * request has data waiting, which is neither. */
int ks__peer_state(int fd) {
    if (fd < 0) return KS_PEER_OK;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) return KS_PEER_OK;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return KS_PEER_GONE;
    if (p.revents & POLLIN) {
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) return KS_PEER_EOF;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return KS_PEER_GONE;
    }
    return KS_PEER_OK;
}

/* The probe of a whole reply: an interim response, which every HTTP/1.1
 * client must accept before the final one and may ignore (RFC 9110 15.2).
 * Written on the socket directly: MHD writes nothing while the request's
 * handler (this thread) waits, so nothing interleaves with it. */
void ks__peer_interim(int fd) {
    static const char msg[] = "HTTP/1.1 100 Continue\r\n\r\n";
    size_t off = 0;
    while (off < sizeof msg - 1) {
        ssize_t n = send(fd, msg + off, sizeof msg - 1 - off, MSG_NOSIGNAL);
        if (n > 0) off += (size_t)n;
        else if (n < 0 && errno == EINTR) continue;
        else return; /* the reset shows at the next poll */
    }
}
