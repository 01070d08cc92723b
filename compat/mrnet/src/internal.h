/* internal.h: what the layer's sources share (not installed). */
#ifndef MRN_COMPAT_INTERNAL_H
#define MRN_COMPAT_INTERNAL_H

#include <stdint.h>

#include <string>
#include <vector>

#include "mrnet/DataElement.h"
#include "mrnet/Packet.h"

namespace MRN {
namespace compat {

/* treecast's type code of an element type (docs/wire-format.md): 0x01..0x0b for a
 * scalar, 0x40 | that for an array; 0 for UNKNOWN_T. */
uint32_t tc_code(DataType t);
/* The element type of a treecast type code (arrays as the 32-bit-length kind). */
DataType from_tc_code(uint32_t code);
/* Bytes of one element of an array type (0 for strings). */
size_t elem_size(DataType t);
bool is_array(DataType t);
/* "%d", "%alf": the treecast specifier of a type. */
const char *tc_spec(DataType t);
/* The treecast format of a packet's values ("%d %as"), built from its elements. */
std::string tc_format(const Packet &p);

/* The types a format string names, in order; false on an unknown specifier. */
bool format_types(const char *fmt, std::vector<DataType> &out);
/* Whether an array type carries a 64-bit length (%A...). */
bool is_large_array(DataType t);

/* A packet's values as treecast's typed-value payload. */
void encode_payload(const Packet &p, std::vector<uint8_t> &out);
/* A packet from a typed-value payload; NULL (with `err`) when it is malformed. */
PacketPtr decode_payload(const uint8_t *data, size_t len, Rank src, unsigned int stream, int tag,
                         std::string &err);
/* Like decode_payload, skipping the first `skip` values. */
PacketPtr decode_payload_from(const uint8_t *data, size_t len, size_t skip, Rank src, unsigned int stream,
                              int tag, std::string &err);

/* MRNet numbers a user stream from USER_STRM_BASE_ID up and a back-end's private
 * stream by the back-end's rank, so a stream id and a rank never meet: treecast's
 * stream id n is the tool's stream id STREAM_ID_BASE + n. */
const unsigned int STREAM_ID_BASE = (1u << 30) + 10;
/* The tool's id of treecast's stream `tc`. */
inline unsigned int mrn_stream_id(uint32_t tc) { return STREAM_ID_BASE + tc; }
/* treecast's id of the tool's stream `id` (one at or above STREAM_ID_BASE). */
inline uint32_t tc_stream_id_of(unsigned int id) { return id - STREAM_ID_BASE; }

/* The name of the adapter plug-in, as streams name it. */
extern const char *const ADAPTER_NAME;

}  // namespace compat
}  // namespace MRN

#endif
