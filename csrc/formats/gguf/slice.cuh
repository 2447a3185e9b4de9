// One slice of the GGUF kernels: the launchers of the types at list index i with
// i % FTW_GGUF_SLICES == FTW_GGUF_SLICE (and of the table-driven decoder, counted as the entry
// after the last type). build.cmake generates one translation unit per slice, defining both, so
// the types' kernels compile in parallel; adding a type to FTW_GGML_CUDA_TYPES needs no build
// change.
#pragma once

#include "formats/gguf/decoders.cuh"

#if !defined(FTW_GGUF_SLICE) || !defined(FTW_GGUF_SLICES)
#error "a GGUF kernel slice is compiled with FTW_GGUF_SLICE and FTW_GGUF_SLICES defined (build.cmake)"
#endif

namespace ftw::cuda {
namespace {

// Dec's launch of `phase` (launch_phase), or with DecodeOnly its decode kernel alone: a decoder
// that serves decode only gets no prefill kernel made for it.
template <class Dec, bool DecodeOnly = false>
void launch_with(int phase, const KernelParams& p, cudaStream_t stream) {
    if constexpr (DecodeOnly) {
        phase == 0 ? launch_decode<Dec, 0>(p, stream) : launch_decode<Dec, 1>(p, stream);
        check_launch(phase == 0 ? "gate_up kernel" : "down kernel");
    } else {
        phase == 0 ? launch_phase<Dec, 0>(p, stream) : launch_phase<Dec, 1>(p, stream);
    }
}

// The staged TypedDecoder<U> with U's tables (TableLoads; Async: filled by cp.async), its ring
// read the way generic_shared_loads<U> says.
template <class U, bool pf, bool Async>
void launch_with_tables(int phase, const KernelParams& p, cudaStream_t stream) {
    if (generic_shared_loads<U>())
        return launch_with<TypedDecoder<U, pf, true, TableLoads<SharedLoadsGeneric, Async>>>(phase, p, stream);
    launch_with<TypedDecoder<U, pf, true, TableLoads<SharedLoads, Async>>>(phase, p, stream);
}

// A projection whose rows are all of type T, on a 16-byte-aligned bank: TypedDecoder<T> the way
// the mode says (GgufMode), in T's min form (with_min_form), the staged kernel reading its ring
// the way generic_shared_loads<T> says, and a default register-fed decode in the shaped loop
// (ShapedDecoder: decode only, so no prefill kernel is made for it).
template <class T>
void launch_typed(int phase, GgufMode m, const KernelParams& p, cudaStream_t stream) {
    with_min_form<T>([&](auto tag) {
        using U = typename decltype(tag)::type;
        constexpr bool pf = HasPrefetch<Fast<U>>::value;
        if (m == GgufMode::kLoaded) return launch_with<TypedDecoder<U, false, false>>(phase, p, stream);
        if (m == GgufMode::kPrefetched) return launch_with<TypedDecoder<U, true, false>>(phase, p, stream);
        // a phase at T = 1 with int8 units read from shared-memory tables (kOptInt8, Int8TableRows:
        // IQ3_XXS, IQ3_S) where int8_for says, before the sums these types take otherwise
        if constexpr (std::is_same_v<U, T> && Int8Tables<Fast<U>>::value) {
            if ((m == GgufMode::kStaged || m == GgufMode::kPerType) && int8_for<U>(p, phase))
                return launch_with<Int8TableRows<U, TypedDecoder<U, pf, true, SharedLoads>>>(phase, p, stream);
        }
        // the IQ types on float32 sub-block sums (IntSumRows) where int_sums<U> says so (staged; also
        // IQ3_XXS, otherwise register-fed, where both phases take the grid in copies or with
        // FTW_GGUF_CUDA_INTSUMS=1)
        constexpr bool int_sums_of_u = std::is_same_v<U, T> && IqInt<U>::kHas;
        if constexpr (int_sums_of_u) {
            if ((m == GgufMode::kStaged || m == GgufMode::kPerType) && int_sums<U>(p)) {
                if constexpr (IqCopies<U>::kHas) {  // the grid in copies where grid_copies says
                    if (grid_copies<U>(p, phase))
                        return launch_with<IntSumRows<U, TypedDecoder<U, pf, true>, true>>(phase, p, stream);
                }
                return launch_with<IntSumRows<U, TypedDecoder<U, pf, true>>>(phase, p, stream);
            }
        }
        // (and at T = 1 with byte columns, kOptByteCols, where FTW_GGUF_CUDA_UNITCOLS=1 asks: byte_cols_forced)
        // (and a phase at T = 1 with int8 units, kOptInt8, where int8_for says; at T = 2..8,
        // kOptInt8Tokens, where int8_tokens_for says)
        const bool staged = StagedPreferred<Fast<U>>::value ||
                            (StagedManyItems<Fast<U>>::value && staged_for_items(p, phase)) || byte_cols_forced<U>(p) ||
                            int8_for<U>(p, phase) || int8_tokens_for<U>(p, phase);
        if (m == GgufMode::kStaged || (m == GgufMode::kPerType && staged)) {
            // on float32 sub-block sums where the type has them (its own min form only: with_min_form's
            // other form keeps the decode it had), unless the ring is read through generic addresses
            if constexpr (SubBlocks<Fast<U>>::value && std::is_same_v<U, T>) {
                if (sub_block_scales<U>() && sub_block_rows<U>(p, phase) && !generic_shared_loads<U>()) {
                    if constexpr (kHasChunkD<Fast<U>>) {
                        if constexpr (HasDecodeWide<Fast<U>>::value) {
                            if (chunk_d() && wide_lanes()) {
                                if constexpr (HasAlignedBody<Fast<U>>::value) {
                                    if (aligned_body())
                                        return launch_with<SubBlockRows<TypedDecoder<U, pf, true>, true, true, true>>(phase, p, stream);
                                }
                                return launch_with<SubBlockRows<TypedDecoder<U, pf, true>, true, true>>(phase, p, stream);
                            }
                        }
                        if (chunk_d()) return launch_with<SubBlockRows<TypedDecoder<U, pf, true>, true>>(phase, p, stream);
                    }
                    return launch_with<SubBlockRows<TypedDecoder<U, pf, true>>>(phase, p, stream);
                }
            }
            // with tables where the type has them (its own min form only)
            if constexpr (std::is_same_v<U, T> && HasTables<Fast<U>>::value) {
                if (decode_with_tables<U>()) {
                    if constexpr (HasFill<Fast<U>>::value) {  // the IQ grids by cp.async but with =1
                        if (!env_is("FTW_GGUF_CUDA_TABLES", "1")) return launch_with_tables<U, pf, true>(phase, p, stream);
                    }
                    return launch_with_tables<U, pf, false>(phase, p, stream);
                }
            }
            if (generic_shared_loads<U>())
                return launch_with<TypedDecoder<U, pf, true, SharedLoadsGeneric>>(phase, p, stream);
            return launch_with<TypedDecoder<U, pf, true>>(phase, p, stream);
        }
        if constexpr (!StagedPreferred<Fast<U>>::value) {  // (else unreachable: no kernel made)
            if (decode_step(p) && !legacy_register_loop())
                return launch_with<ShapedDecoder<TypedDecoder<U, pf, false>>, true>(phase, p, stream);
        }
        launch_with<TypedDecoder<U, pf, false>>(phase, p, stream);
    });
}

void launch_table_driven(int phase, GgufMode, const KernelParams& p, cudaStream_t stream) {
    launch_with<GgmlDecoder>(phase, p, stream);
}

constexpr bool in_slice(int index) { return index % FTW_GGUF_SLICES == FTW_GGUF_SLICE; }

template <int I>
void register_slice(TypeList<void>) {
    if constexpr (in_slice(I)) register_gguf_launch(kTableDriven, launch_table_driven);
}
template <int I, class T, class... Rest>
void register_slice(TypeList<T, Rest...>) {
    if constexpr (in_slice(I) && Fast<T>::kHas) register_gguf_launch(T::size.id, launch_typed<T>);
    register_slice<I + 1>(TypeList<Rest...>{});
}

const bool registered = (register_slice<0>(CudaTypes{}), true);

}  // namespace
}  // namespace ftw::cuda
