// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), self-contained. On x86-64
// the compression function uses the SHA extensions where the CPU has them
// (chosen once at run time); elsewhere, and on CPUs without them, a portable
// one. Both give the same digests.
#ifndef JAXCC_CPU_HMAC_SHA256_H_
#define JAXCC_CPU_HMAC_SHA256_H_

#include <cstddef>
#include <cstdint>

namespace jaxcc {

// A SHA-256 hash of the bytes given to Update, in any pieces.
class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t bytes);
  // Writes the digest. After Final the object may be reused only after a
  // reset (assignment from a fresh or saved Sha256).
  void Final(uint8_t out[32]);

 private:
  uint32_t state_[8];
  uint64_t bytes_;    // hashed so far; the last bytes_ % 64 of them are in tail_
  uint8_t tail_[64];  // the start of a block not yet compressed
};

// An HMAC-SHA256 of the bytes given to Update under a fixed key.
class HmacSha256 {
 public:
  HmacSha256() = default;  // an unkeyed placeholder, to be assigned a keyed one
  // Keys longer than 64 bytes are hashed first.
  HmacSha256(const uint8_t* key, size_t key_bytes);
  // Back to the keyed start: copies the precomputed inner and outer states.
  void Reset();
  void Update(const void* data, size_t bytes);
  // Writes the tag; then Reset() before the next message.
  void Final(uint8_t out[32]);

 private:
  Sha256 inner_start_;  // after the block key ^ ipad
  Sha256 outer_start_;  // after the block key ^ opad
  Sha256 inner_;        // the message so far
};

// Whether a and b (n bytes each) are equal, in time independent of where they
// differ.
bool DigestsEqual(const uint8_t* a, const uint8_t* b, size_t n);

}  // namespace jaxcc

#endif  // JAXCC_CPU_HMAC_SHA256_H_
