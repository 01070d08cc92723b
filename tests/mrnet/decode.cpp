/* decode.cpp: the layer's reading of treecast payloads (what the filter adapter does with
 * bytes from the wire at every comm node) refuses malformed input instead of crashing or
 * allocating what the bytes claim. Built with the layer's sources (compat/mrnet/src). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <string>
#include <vector>

#include "internal.h"

using namespace MRN;
using namespace MRN::compat;

static int failures = 0;

static void refused(const char *what, const std::vector<uint8_t> &bytes) {
    std::string err;
    PacketPtr p = decode_payload(bytes.empty() ? NULL : &bytes[0], bytes.size(), 0, 1, 1, err);
    if (p || err.empty()) {
        fprintf(stderr, "decode: %s was read as a packet\n", what);
        failures++;
    }
}

static void put32(std::vector<uint8_t> &b, uint32_t v) {
    for (int i = 0; i < 4; i++) b.push_back((uint8_t)(v >> (8 * i)));
}

int main() {
    std::vector<uint8_t> b;
    /* a string array claiming 2^32-1 strings in 4 bytes */
    b.push_back(0x4b);
    put32(b, 0xffffffffu);
    put32(b, 0);
    refused("a string array longer than its payload", b);
    /* an int64 array claiming more than it carries */
    b.clear();
    b.push_back(0x47);
    put32(b, 0xffffffffu);
    b.push_back(1);
    refused("an int64 array longer than its payload", b);
    /* a string longer than its payload */
    b.clear();
    b.push_back(0x0b);
    put32(b, 100);
    b.push_back('x');
    refused("a string longer than its payload", b);
    /* an unknown type code, a value cut short */
    b.clear();
    b.push_back(0x3f);
    refused("an unknown type code", b);
    b.clear();
    b.push_back(0x07);
    b.push_back(1);
    refused("an int64 cut short", b);
    /* and a good one still reads */
    const char *strs[] = {"a", "bc"};
    const double lfs[] = {1.5};
    PacketPtr good(new Packet(1u, 1, "%d %as %alf", 7, strs, 2u, lfs, 1u));
    b.clear();
    encode_payload(*good, b);
    std::string err;
    PacketPtr back = decode_payload(&b[0], b.size(), 0, 1, 1, err);
    if (!back || back->get_NumDataElements() != 3 || (*back)[0]->get_int32_t() != 7) {
        fprintf(stderr, "decode: a good payload was refused: %s\n", err.c_str());
        failures++;
    }
    if (failures) return 1;
    printf("mrnet-decode: ok\n");
    return 0;
}
