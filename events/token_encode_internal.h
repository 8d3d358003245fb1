// The token tuples of vLLM's block preimages, eight tokens per step: pickle's BININT1 / BININT2 /
// BININT and canonical CBOR's unsigned integers, with AVX-512 VBMI2 where the CPU has it (checked
// once at run time; elsewhere nothing here is used and the scalar encoders of block_hash.cc write
// every token). The bytes are exactly the scalar encoders': tests/events/block_hash_test.cc checks
// both against the general pickler and CBOR writer on random chains.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvo::token_encode {

// True when the CPU has AVX-512 F/BW/VL/VBMI/VBMI2 and BMI2 (and the build targets x86-64).
bool VectorAvailable();

// Encode tokens at *p eight at a time while a whole group of eight is left and every token of the
// group is in range (pickle: [0, INT32_MAX]; CBOR: [0, UINT32_MAX]); advances *p and returns the
// number of tokens written (a multiple of 8; the caller encodes the rest one by one). Needs
// VectorAvailable() and 64 writable bytes at *p past each group's start (a group writes at most
// 40 bytes but stores 64).
size_t PickleGroups(const int64_t* tokens, size_t n, uint8_t** p);
size_t CborGroups(const int64_t* tokens, size_t n, uint8_t** p);

// The slack PickleGroups and CborGroups need past the bytes they keep.
inline constexpr size_t kGroupSlack = 64;

}  // namespace kvo::token_encode
