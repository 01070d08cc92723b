/* mrnet/Packet.h: a tag, a stream id, a source rank and typed values. PacketPtr is a
 * std::shared_ptr (MRNet's was boost's): `PacketPtr p(new Packet(...))` works as before. */
#if !defined(__packet_h)
#define __packet_h 1

#include <cstdarg>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "mrnet/DataElement.h"
#include "mrnet/Error.h"
#include "mrnet/Types.h"

namespace MRN {

class Packet;
typedef std::shared_ptr<Packet> PacketPtr;

class Packet : public Error {
    friend class Stream;
    friend class Network;

 public:
    static PacketPtr NullPacket;

    /* Values typed by `ifmt` ("%d %alf %as"), as the variadic arguments give them. */
    Packet(unsigned int istream_id, int itag, const char *ifmt, ...);
    Packet(const char *ifmt, va_list idata, unsigned int istream_id, int itag);
    /* Values from an array of pointers to each (`idata[i]` points to value i; an
     * array takes two entries: the array's pointer, then a pointer to its length). */
    Packet(unsigned int istream_id, int itag, const void **idata, const char *ifmt);
    ~Packet();

    /* Reads the values into the pointers that follow (strings and arrays are copies
     * the caller frees with free()); -1 when `ifmt` does not match the packet. */
    int unpack(const char *ifmt, ...);
    int unpack(va_list iarg_list, const char *ifmt, bool);

    const DataElement *operator[](unsigned int i) const;
    int get_Tag(void) const;
    void set_Tag(int itag) { tag = itag; }
    unsigned int get_StreamId(void) const;
    void set_StreamId(unsigned int istream_id) { stream_id = istream_id; }
    const char *get_FormatString(void) const;
    Rank get_InletNodeRank(void) const;
    Rank get_SourceRank(void) const;
    bool get_Destinations(unsigned &num_dest, Rank **dests);
    bool set_Destinations(const Rank *bes, unsigned int num_bes);
    bool operator==(const Packet &) const;
    bool operator!=(const Packet &) const;
    void set_DestroyData(bool b);
    void set_IncomingPktCount(int) {}
    void set_OutgoingPktCount(int) {}

    /* The layer's own use: an empty packet to fill, and its values. */
    Packet(Rank isrc, unsigned int istream_id, int itag);
    size_t get_NumDataElements(void) const { return data_elements.size(); }
    /* Adds an element, taking it; `fmt` gets its specifier. */
    void add_DataElement(DataElement *e);
    void set_SourceRank(Rank r) { src_rank = r; }

 private:
    Packet(const Packet &);
    Packet &operator=(const Packet &);
    int fill(const char *ifmt, va_list ap);
    uint32_t stream_id;
    int32_t tag;
    Rank src_rank;
    std::string fmt_str;
    std::vector<DataElement *> data_elements;
    std::vector<Rank> dests;
};

} /* namespace MRN */

#endif /* __packet_h */
