/* xplat/Mutex.h: a mutex for tools that use MRNet's portable one (treecast's
 * MRNet-compatible layer). */
#ifndef XPLAT_MUTEX_H
#define XPLAT_MUTEX_H

#include <mutex>

namespace XPlat {

/* A plain mutex: Lock and Unlock return 0. */
class Mutex {
 public:
    int Lock() { m.lock(); return 0; }
    int Unlock() { m.unlock(); return 0; }
 private:
    std::mutex m;
};

} /* namespace XPlat */

#endif /* XPLAT_MUTEX_H */
