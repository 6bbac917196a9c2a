// Copying bytes between buffers of the host.
#pragma once

#include <cstddef>

namespace smddp {

// Like memcpy, but a no-op for 0 bytes (null pointers allowed then), and
// with non-temporal stores for large copies: their destination is rarely
// read again soon, and streaming it skips the read-for-ownership of every
// destination line.
void copyBytes(void* dst, const void* src, size_t bytes);

} // namespace smddp
