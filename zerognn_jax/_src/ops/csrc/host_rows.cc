// Row gathers from a feature table kept in host memory, as XLA FFI handlers.
//
// `zerognn_host_rows(ids int32[C], valid bool[C], order int32[C]) -> out[C, width]` with
// attributes `table` (the number the table was bound under, below), `rows` (its row
// count) and `row_bytes`: row c of `out` is row ids[c] of the table, or zeros where
// valid[c] is false or ids[c] lies outside [0, rows). `order` is a permutation of [0, C) in which the rows are read
// (ids ascending: GPU reads of host memory in address order run 1.8-2.4x faster over PCIe
// than in random order, measured in docs/host_features.md). The table is never an XLA
// buffer: it stays where its owner put it.
//
// `zerognn_rows_to_host(block[R, width], first int32[]) -> written int32[]`, the other
// way (exact inference's layer outputs, training/evaluate.py): rows [first, first + R)
// of the table get the block's rows, those outside [0, rows) are skipped,
// and `written` counts the rows stored. `first` is read where it lies (on the device in
// a GPU program), so one compiled loop writes every chunk of a layer without the host.
//
// A program names its table by a number, not by its address: `zg_bind(table, address)`
// binds the number when the table is made and `zg_unbind` when it is collected, so two
// processes that make their tables in the same order compile the same program (and
// JAX's persistent compilation cache finds it), and a program run after its table is
// gone fails with an error instead of reading freed memory.
//
// Built by ops/host_rows.py: with a C++ compiler for the CPU handler alone, and with
// nvcc (this file as CUDA) for the CUDA handler as well, whose kernel reads page-locked
// host memory directly over PCIe (zero-copy) from inside the compiled step. The CUDA
// build also exports `zg_register`/`zg_unregister`, which page-lock a table in place.

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

std::mutex bound_mutex;
std::unordered_map<int64_t, int64_t>& Bound() {  // table number -> its first byte
  static auto* bound = new std::unordered_map<int64_t, int64_t>();
  return *bound;
}

// The address of table `table` into `address`, or an error naming `what` if none is bound.
ffi::Error Address(int64_t table, const char* what, int64_t& address) {
  std::lock_guard<std::mutex> hold(bound_mutex);
  const auto found = Bound().find(table);
  if (found == Bound().end()) {
    return ffi::Error::InvalidArgument(
        std::string(what) + ": host table " + std::to_string(table) +
        " is not held any more (a program ran after its HostTable was collected)");
  }
  address = found->second;
  return ffi::Error::Success();
}

// Checks shared by both handlers; the out buffer must hold exactly C rows.
ffi::Error CheckShapes(const ffi::Buffer<ffi::S32>& ids, const ffi::Buffer<ffi::PRED>& valid,
                       const ffi::Buffer<ffi::S32>& order, const ffi::AnyBuffer& out,
                       int64_t rows, int64_t row_bytes) {
  if (rows < 0 || row_bytes <= 0) {
    return ffi::Error::InvalidArgument("zerognn_host_rows: rows " + std::to_string(rows) +
                                       " and row_bytes " + std::to_string(row_bytes) +
                                       " must be non-negative and positive");
  }
  const int64_t n = static_cast<int64_t>(ids.element_count());
  if (static_cast<int64_t>(valid.element_count()) != n ||
      static_cast<int64_t>(order.element_count()) != n) {
    return ffi::Error::InvalidArgument(
        "zerognn_host_rows: ids, valid and order differ in length");
  }
  if (static_cast<int64_t>(out.size_bytes()) != n * row_bytes) {
    return ffi::Error::InvalidArgument(
        "zerognn_host_rows: the output holds " + std::to_string(out.size_bytes()) +
        " bytes, not " + std::to_string(n) + " rows of " + std::to_string(row_bytes));
  }
  return ffi::Error::Success();
}

// The block written to the host must be whole rows of the table's row size.
ffi::Error CheckBlock(const ffi::AnyBuffer& block, int64_t row_bytes) {
  if (row_bytes <= 0 || block.size_bytes() % row_bytes != 0) {
    return ffi::Error::InvalidArgument(
        "zerognn_rows_to_host: a block of " + std::to_string(block.size_bytes()) +
        " bytes is not whole rows of " + std::to_string(row_bytes));
  }
  return ffi::Error::Success();
}

// The handlers' signatures, each written once for both platforms: `bind` is
// ffi::Ffi::Bind() for the CPU handlers, and that with the CUDA stream as context
// (Ctx<ffi::PlatformStream<cudaStream_t>>) for the CUDA ones.
template <typename Binding>
auto HostRowsSignature(Binding bind) {
  return std::move(bind)
      .template Arg<ffi::Buffer<ffi::S32>>()   // ids
      .template Arg<ffi::Buffer<ffi::PRED>>()  // valid
      .template Arg<ffi::Buffer<ffi::S32>>()   // order
      .template Ret<ffi::AnyBuffer>()          // out
      .template Attr<int64_t>("table")
      .template Attr<int64_t>("rows")
      .template Attr<int64_t>("row_bytes");
}

template <typename Binding>
auto RowsToHostSignature(Binding bind) {
  return std::move(bind)
      .template Arg<ffi::AnyBuffer>()         // block
      .template Arg<ffi::Buffer<ffi::S32>>()  // first
      .template Ret<ffi::Buffer<ffi::S32>>()  // written
      .template Attr<int64_t>("table")
      .template Attr<int64_t>("rows")
      .template Attr<int64_t>("row_bytes");
}

ffi::Error HostRowsCpu(ffi::Buffer<ffi::S32> ids, ffi::Buffer<ffi::PRED> valid,
                       ffi::Buffer<ffi::S32> order, ffi::Result<ffi::AnyBuffer> out,
                       int64_t number, int64_t rows, int64_t row_bytes) {
  ffi::Error err = CheckShapes(ids, valid, order, *out, rows, row_bytes);
  if (err.failure()) return err;
  int64_t address = 0;
  err = Address(number, "zerognn_host_rows", address);
  if (err.failure()) return err;
  const char* table = reinterpret_cast<const char*>(address);
  char* dst = static_cast<char*>(out->untyped_data());
  const int32_t* id = ids.typed_data();
  const bool* ok = valid.typed_data();
  const int32_t* by = order.typed_data();
  const int64_t n = static_cast<int64_t>(ids.element_count());
  for (int64_t k = 0; k < n; ++k) {
    const int64_t c = by[k];
    if (c < 0 || c >= n) {
      return ffi::Error::InvalidArgument("zerognn_host_rows: order is not a permutation");
    }
    const int64_t r = id[c];
    if (ok[c] && r >= 0 && r < rows) {
      std::memcpy(dst + c * row_bytes, table + r * row_bytes, row_bytes);
    } else {
      std::memset(dst + c * row_bytes, 0, row_bytes);
    }
  }
  return ffi::Error::Success();
}

ffi::Error RowsToHostCpu(ffi::AnyBuffer block, ffi::Buffer<ffi::S32> first,
                         ffi::Result<ffi::Buffer<ffi::S32>> written, int64_t number,
                         int64_t rows, int64_t row_bytes) {
  ffi::Error err = CheckBlock(block, row_bytes);
  if (err.failure()) return err;
  int64_t address = 0;
  err = Address(number, "zerognn_rows_to_host", address);
  if (err.failure()) return err;
  const int64_t n = static_cast<int64_t>(block.size_bytes()) / row_bytes;
  const int64_t r0 = first.typed_data()[0];
  const int64_t lo = r0 < 0 ? -r0 : 0;
  const int64_t hi = r0 + n > rows ? rows - r0 : n;
  const char* src = static_cast<const char*>(block.untyped_data());
  char* table = reinterpret_cast<char*>(address);
  if (hi > lo) {
    std::memcpy(table + (r0 + lo) * row_bytes, src + lo * row_bytes, (hi - lo) * row_bytes);
  }
  written->typed_data()[0] = static_cast<int32_t>(hi > lo ? hi - lo : 0);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZgHostRowsCpu, HostRowsCpu,
                              HostRowsSignature(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZgRowsToHostCpu, RowsToHostCpu,
                              RowsToHostSignature(ffi::Ffi::Bind()));

extern "C" void zg_bind(int64_t table, int64_t address) {
  std::lock_guard<std::mutex> hold(bound_mutex);
  Bound()[table] = address;
}

extern "C" void zg_unbind(int64_t table) {
  std::lock_guard<std::mutex> hold(bound_mutex);
  Bound().erase(table);
}

#ifdef __CUDACC__

#include <cuda_runtime.h>

namespace {

// One thread per `Word` of the output, the k-th row read being row order[k]: consecutive
// threads read consecutive words of a row, so each warp's loads of a row go out as whole
// PCIe read requests, and consecutive rows in `order` are read at rising addresses.
template <typename Word>
__global__ void GatherRows(const Word* __restrict__ table, const int32_t* __restrict__ ids,
                           const bool* __restrict__ valid, const int32_t* __restrict__ order,
                           Word* __restrict__ out, int64_t rows, int64_t words_per_row,
                           int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t k = i / words_per_row;
    const int64_t w = i - k * words_per_row;
    const int64_t c = order[k];
    const int64_t r = ids[c];
    Word v{};
    if (valid[c] && r >= 0 && r < rows) v = table[r * words_per_row + w];
    out[c * words_per_row + w] = v;
  }
}

// Blocks of 256 threads for `total` threads, between 1 and 32768 (the kernels stride).
int Blocks(int64_t total) {
  const int64_t wanted = (total + 255) / 256;
  return static_cast<int>(wanted < 1 ? 1 : wanted < 32768 ? wanted : 32768);
}

// Runs `launch(Word{})` with the widest word that divides both the table's address and
// its row size (16, 4, 2 or 1 bytes); a launch error becomes an FFI error named `what`.
template <typename LaunchFn>
ffi::Error ByWord(int64_t address, int64_t row_bytes, const char* what, LaunchFn launch) {
  const int64_t align = address | row_bytes;
  const cudaError_t status = align % 16 == 0  ? launch(uint4{})
                             : align % 4 == 0 ? launch(uint32_t{})
                             : align % 2 == 0 ? launch(uint16_t{})
                                              : launch(uint8_t{});
  if (status != cudaSuccess) {
    return ffi::Error::Internal(std::string(what) + ": " + cudaGetErrorString(status));
  }
  return ffi::Error::Success();
}

ffi::Error HostRowsCuda(cudaStream_t stream, ffi::Buffer<ffi::S32> ids,
                        ffi::Buffer<ffi::PRED> valid, ffi::Buffer<ffi::S32> order,
                        ffi::Result<ffi::AnyBuffer> out, int64_t number, int64_t rows,
                        int64_t row_bytes) {
  ffi::Error err = CheckShapes(ids, valid, order, *out, rows, row_bytes);
  if (err.failure()) return err;
  int64_t address = 0;
  err = Address(number, "zerognn_host_rows", address);
  if (err.failure()) return err;
  const int64_t n = static_cast<int64_t>(ids.element_count());
  return ByWord(address, row_bytes, "zerognn_host_rows", [&](auto word) {
    using Word = decltype(word);
    const int64_t words = row_bytes / static_cast<int64_t>(sizeof(Word));
    if (n * words == 0) return cudaSuccess;
    GatherRows<Word><<<Blocks(n * words), 256, 0, stream>>>(
        reinterpret_cast<const Word*>(address), ids.typed_data(), valid.typed_data(),
        order.typed_data(), static_cast<Word*>(out->untyped_data()), rows, words, n * words);
    return cudaGetLastError();
  });
}

// Stores the block's rows into the mapped host table (zero-copy writes over PCIe: one
// thread per `Word`, consecutive threads at consecutive addresses), rows [lo, hi) of the
// block, lo and hi from `first` as the CPU handler computes them; thread 0 writes the
// count.
template <typename Word>
__global__ void StoreRows(const Word* __restrict__ block, const int32_t* __restrict__ first,
                          Word* __restrict__ table, int32_t* __restrict__ written, int64_t n,
                          int64_t rows, int64_t words_per_row) {
  const int64_t r0 = first[0];
  const int64_t lo = r0 < 0 ? -r0 : 0;
  const int64_t hi = r0 + n > rows ? rows - r0 : n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (start == 0) *written = static_cast<int32_t>(hi > lo ? hi - lo : 0);
  for (int64_t i = lo * words_per_row + start; i < hi * words_per_row; i += stride) {
    table[r0 * words_per_row + i] = block[i];
  }
}

ffi::Error RowsToHostCuda(cudaStream_t stream, ffi::AnyBuffer block,
                          ffi::Buffer<ffi::S32> first,
                          ffi::Result<ffi::Buffer<ffi::S32>> written, int64_t number,
                          int64_t rows, int64_t row_bytes) {
  ffi::Error err = CheckBlock(block, row_bytes);
  if (err.failure()) return err;
  int64_t address = 0;
  err = Address(number, "zerognn_rows_to_host", address);
  if (err.failure()) return err;
  const int64_t n = static_cast<int64_t>(block.size_bytes()) / row_bytes;
  return ByWord(address, row_bytes, "zerognn_rows_to_host", [&](auto word) {
    using Word = decltype(word);
    const int64_t words = row_bytes / static_cast<int64_t>(sizeof(Word));
    // At least one block even for no rows: its thread 0 writes the count.
    StoreRows<Word><<<Blocks(n * words), 256, 0, stream>>>(
        static_cast<const Word*>(block.untyped_data()), first.typed_data(),
        reinterpret_cast<Word*>(address), written->typed_data(), n, rows, words);
    return cudaGetLastError();
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    ZgHostRowsCuda, HostRowsCuda,
    HostRowsSignature(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    ZgRowsToHostCuda, RowsToHostCuda,
    RowsToHostSignature(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});

// Page-locks [address, address + bytes) and checks that the GPU sees it at its host
// address (unified addressing), which the handler above relies on. `read_only` memory
// (a file mapped for reading) is registered as such: CUDA refuses it otherwise. Returns
// an empty string, or what went wrong; on failure the range is left unregistered.
// ops/host_rows.py registers a large table piece by piece (one registration may be
// limited by the driver).
extern "C" const char* zg_register(int64_t address, int64_t bytes, int32_t read_only) {
  static thread_local std::string message;
  void* base = reinterpret_cast<void*>(address);
  unsigned int flags = cudaHostRegisterPortable | cudaHostRegisterMapped;
  if (read_only) flags |= cudaHostRegisterReadOnly;
  cudaError_t status = cudaHostRegister(base, bytes, flags);
  if (status != cudaSuccess) {
    message = cudaGetErrorString(status);
    return message.c_str();
  }
  void* seen = nullptr;
  status = cudaHostGetDevicePointer(&seen, base, 0);
  message = status != cudaSuccess ? cudaGetErrorString(status)
            : seen != base ? "the GPU maps the table at another address than the host's"
                           : "";
  if (!message.empty()) cudaHostUnregister(base);
  return message.c_str();
}

extern "C" void zg_unregister(int64_t address) {
  cudaHostUnregister(reinterpret_cast<void*>(address));
}

#endif  // __CUDACC__
