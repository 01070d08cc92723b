/* xplat/Thread.h: threads as MRNet's xplat library gives them (libxplat), over POSIX
 * threads. Each int function returns 0 on success, else the pthread error number. */
#ifndef XPLAT_THREAD_H
#define XPLAT_THREAD_H

namespace XPlat {

class Thread {
 public:
    typedef void *(*Func)(void *);
    /* A thread, as a pthread_t. */
    typedef unsigned long Id;

    /* Starts `func(data)` on a new thread; its id in `id`. */
    static int Create(Func func, void *data, Id *id);
    /* The calling thread's id. */
    static Id GetId(void);
    /* Waits for a thread to end; its return value in `exitValue` (may be NULL). */
    static int Join(Id joinWith, void **exitValue);
    /* Asks a thread to stop at its next cancellation point. */
    static int Cancel(Id id);
    /* Ends the calling thread with `val` as its return value. */
    static void Exit(void *val);
};

}  // namespace XPlat

#endif  // XPLAT_THREAD_H
