/* mrnet_lightweight/Stream.h: a back-end's end of a stream, for C back-ends. Streams
 * are the network's: a back-end learns of them by receiving. */
#ifndef MRNET_LIGHTWEIGHT_STREAM_H
#define MRNET_LIGHTWEIGHT_STREAM_H

#include "mrnet_lightweight/Packet.h"
#include "mrnet_lightweight/Types.h"

#define INVALID_STREAM_ID ((unsigned int)-1)

/* Opaque: the library's own (MRNet's fields are internal to it too). */
typedef struct Stream_t Stream_t;

#ifdef __cplusplus
extern "C" {
#endif

unsigned int Stream_get_Id(Stream_t *stream);
/* Sends values typed by `iformat_str` up the stream; 0, or -1 on failure (waits
 * while the stream's window is full, as MRNet's does). */
int Stream_send(Stream_t *stream, int itag, const char *iformat_str, ...);
/* Sends a packet made by new_Packet_t_2 (its tag, this stream); 0, after which the
 * packet is freed (as MRNet's library does), or -1 (the packet stays the caller's). */
int Stream_send_packet(Stream_t *stream, Packet_t *ipacket);
/* Hands what was sent to the writer; 0 or -1 (docs/mrnet-compat.md: flush). */
int Stream_flush(Stream_t *stream);
/* A packet of this stream: 1 with one, 0 when none arrived (not blocking), -1 on
 * failure or once the stream is closed. */
int Stream_recv(Stream_t *stream, int *otag, Packet_t *opacket, bool_t blocking);
/* Whether the front-end closed the stream. */
char Stream_is_Closed(Stream_t *stream);
/* MRNet's older name of Stream_is_Closed. */
char Stream_is_ShutDown(Stream_t *stream);

#ifdef __cplusplus
}
#endif

#endif /* MRNET_LIGHTWEIGHT_STREAM_H */
