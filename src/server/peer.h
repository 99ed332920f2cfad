/*
 * peer.h — the client's end of a connection while a generation runs
 * (server.h note 3): whether it left, and the probe that tells a client that
 * half-closed (it reads on) from one that closed the socket (its kernel
 * answers the probe with a reset). gen.c polls it between waits.
 *
 * Thread model: the request's connection thread, on its own socket.
 */
#ifndef KS_PEER_H
#define KS_PEER_H

/* What the client's socket says. */
enum { KS_PEER_OK = 0, KS_PEER_EOF, KS_PEER_GONE };

/* KS_PEER_GONE: the connection broke (a reset, a read error); KS_PEER_EOF:
 * the client will send nothing more; KS_PEER_OK otherwise, and for fd < 0.
 * Never blocks; reads nothing (a pipelined request stays for MHD). */
int ks__peer_state(int fd);
/* Writes "HTTP/1.1 100 Continue" on fd: the probe of a whole reply. */
void ks__peer_interim(int fd);

#endif
