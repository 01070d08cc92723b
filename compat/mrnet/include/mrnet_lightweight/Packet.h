/* mrnet_lightweight/Packet.h: a tag, a stream id, a source rank and typed values, for C
 * back-ends. A Packet_t is the caller's (MRNet's programs malloc one and receive into
 * it again and again); its values stay with the library until the next receive into
 * it, delete_Packet_t, or the end of the process. */
#ifndef MRNET_LIGHTWEIGHT_PACKET_H
#define MRNET_LIGHTWEIGHT_PACKET_H

#include <stdarg.h>

#include "mrnet_lightweight/DataElement.h"
#include "mrnet_lightweight/Types.h"

struct vector_t;

/* MRNet 5.0.1's fields, so that sizeof matches what its programs allocate. A
 * received packet has stream_id, tag, src_rank, inlet_rank and fmt_str filled; the
 * encoded header and payload stay inside the library (hdr and buf are NULL). */
typedef struct {
    uint32_t stream_id;
    int32_t tag;
    Rank src_rank;
    char *fmt_str;
    char *hdr;
    unsigned int hdr_len;
    char *buf;
    uint64_t buf_len;
    Rank inlet_rank;
    struct vector_t *data_elements;
    char byteorder;
} Packet_t;

#ifdef __cplusplus
extern "C" {
#endif

/* A new packet of values typed by `fmt` ("%d %as"), for Stream_send_packet (which
 * frees it once sent); NULL when `fmt` names an unknown code. Free an unsent one with
 * delete_Packet_t. */
Packet_t *new_Packet_t_2(unsigned int istream_id, int itag, const char *fmt, ...);
/* As new_Packet_t_2, from a va_list, with a source rank. */
Packet_t *new_Packet_t(Rank isrc, unsigned int istream_id, int itag, const char *fmt, va_list arg_list);
/* Accepted for MRNet's programs: received values are the caller's copies anyway. */
void Packet_set_DestroyData(Packet_t *packet, int dd);
int Packet_get_Tag(Packet_t *packet);
void Packet_set_Tag(Packet_t *packet, int tag);
unsigned int Packet_get_StreamId(Packet_t *packet);
void Packet_set_StreamId(Packet_t *packet, unsigned int strm_id);
/* The packet's format string ("%d %s"); NULL for a packet the library never filled. */
char *Packet_get_FormatString(Packet_t *packet);
/* Reads the values into the pointers that follow (strings and arrays are copies the
 * caller frees with free()); 0 on success, -1 when `ifmt` does not match the packet. */
int Packet_unpack(Packet_t *packet, const char *ifmt_str, ...);
int Packet_unpack_valist(Packet_t *packet, va_list arg_list, const char *ifmt_str);
/* Lets go of the packet's values and frees the packet itself. */
void delete_Packet_t(Packet_t *packet);

#ifdef __cplusplus
}
#endif

#endif /* MRNET_LIGHTWEIGHT_PACKET_H */
