//! Allocator settings for processes that move large frames.

/// Has glibc's malloc serve buffers of up to 32 MiB from its heap, and keep up to
/// 64 MiB of freed heap, instead of mapping a fresh region for every large frame's
/// read buffer and unmapping it when the frame is gone: each such region costs a
/// page fault and a zeroed page per 4 KiB, on every frame. With it, 4 MiB messages
/// between back-ends took 3.9 ms one-way instead of 11.3 ms (`treecast bench
/// intergroup`, 2 cores). Call it at the start of `main`, before threads start;
/// elsewhere than Linux with glibc it does nothing.
pub fn keep_large_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: mallopt only sets allocator parameters; it takes no pointers.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}
