/* xplat_lightweight/Thread.h: threads as MRNet's lightweight xplat library gives them
 * (libxplat_lightweight), over POSIX threads. Each int function returns 0 on success,
 * else the pthread error number. */
#ifndef XPLAT_LIGHTWEIGHT_THREAD_H
#define XPLAT_LIGHTWEIGHT_THREAD_H

#ifdef __cplusplus
extern "C" {
#endif

typedef void *(*Thread_Func)(void *);
/* A thread, as a pthread_t. */
typedef long Thread_Id;

/* Starts `func(data)` on a new thread; its id in `id`. */
int Thread_Create(Thread_Func func, void *data, Thread_Id *id);
/* The calling thread's id. */
Thread_Id Thread_GetId(void);
/* Waits for a thread to end; its return value in `exitValue` (may be NULL). */
int Thread_Join(Thread_Id joinWith, void **exitValue);
/* Asks a thread to stop at its next cancellation point. */
int Thread_Cancel(Thread_Id id);
/* Ends the calling thread with `val` as its return value. */
void Thread_Exit(void *val);

#ifdef __cplusplus
}
#endif

#endif /* XPLAT_LIGHTWEIGHT_THREAD_H */
