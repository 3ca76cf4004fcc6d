//! The device-layer test kernels. Each writes every output element it owns,
//! so the host can poison outputs with NaN and check all of them.
//!
//! Safety of every kernel: the pointers in its parameter struct hold the
//! element counts documented on the struct, and the launch shape is the one
//! documented there (the host test sizes both).

use crate::params::*;
use gpu_kernels::device::*;

macro_rules! shfl_kernel {
    ($name:ident, $f32:ident, $u32:ident, $i32:ident) => {
        /// # Safety
        /// See the module docs and [`ShflParams`].
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: ShflParams) {
            let i = global_idx_x();
            // Uniform per warp (n is a multiple of 32), so whole warps leave together.
            if i >= p.n {
                return;
            }
            let (n, i) = (p.n as usize, i as usize);
            // SAFETY: i < n and the row offsets stay below SHFL_ROWS * n.
            unsafe {
                let vf = *p.inp_f32.add(i);
                let vu = *p.inp_u32.add(i);
                let vi = vu as i32;
                for k in 0..SHFL_UNIFORM_ROWS {
                    let o = k as usize * n + i;
                    *p.out_f32.add(o) = $f32(vf, k);
                    *p.out_u32.add(o) = $u32(vu, k);
                    *p.out_i32.add(o) = $i32(vi, k);
                }
                let k = *p.lane_arg.add(i);
                let o = SHFL_LANE_ARG_ROW as usize * n + i;
                *p.out_f32.add(o) = $f32(vf, k);
                *p.out_u32.add(o) = $u32(vu, k);
                *p.out_i32.add(o) = $i32(vi, k);
            }
        }
    };
}

shfl_kernel!(test_shfl_xor, shfl_xor_f32, shfl_xor_u32, shfl_xor_i32);
shfl_kernel!(test_shfl_down, shfl_down_f32, shfl_down_u32, shfl_down_i32);
shfl_kernel!(test_shfl_idx, shfl_idx_f32, shfl_idx_u32, shfl_idx_i32);

/// # Safety
/// See the module docs and [`WarpReduceParams`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn test_warp_reduce(p: WarpReduceParams) {
    let i = global_idx_x();
    if i >= p.n {
        return;
    }
    let i_ = i as usize;
    // SAFETY: i < n.
    unsafe {
        let v = *p.inp.add(i_);
        let u = *p.inp_u32.add(i_);
        *p.sum.add(i_) = warp_reduce_sum(v);
        *p.max.add(i_) = warp_reduce_max(v);
        *p.min.add(i_) = warp_reduce_min(v);
        *p.sum_u32.add(i_) = warp_reduce_sum_u32(u);
        *p.max_u32.add(i_) = warp_reduce_max_u32(u);
        let (mv, mi) = warp_reduce_argmax(*p.inp_argmax.add(i_), i);
        *p.argmax_val.add(i_) = mv;
        *p.argmax_idx.add(i_) = mi;
    }
}

// The host sizes the scratch from the params constant.
const _: () = assert!(BLOCK_REDUCE_SCRATCH_F32S as usize == BLOCK_REDUCE_SCRATCH);

/// # Safety
/// See the module docs and [`BlockReduceParams`]; launched with
/// `BLOCK_REDUCE_SCRATCH_F32S` floats of dynamic shared memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn test_block_reduce(p: BlockReduceParams) {
    let i = global_idx_x() as usize;
    // No early return: every thread must reach the barriers (the grid covers n exactly).
    // SAFETY: i < n; the scratch is the launch's dynamic shared memory, and
    // the three calls may share it because each ends with a barrier.
    unsafe {
        let scratch = dynamic_shared::<f32>();
        let v = *p.inp.add(i);
        let s = block_reduce_sum(v, scratch);
        let m = block_reduce_max(v, scratch);
        let l = block_reduce_min(v, scratch);
        *p.sum.add(i) = s;
        *p.max.add(i) = m;
        *p.min.add(i) = l;
    }
}

/// # Safety
/// See the module docs and [`MathParams`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn test_math(p: MathParams) {
    let n = p.n as usize;
    let mut i = global_idx_x();
    while i < p.n {
        let i_ = i as usize;
        // SAFETY: i < n and rows < MATH_ROWS.
        unsafe {
            let x = *p.inp.add(i_);
            let row = |r: u32| p.out.add(r as usize * n + i_);
            *row(MATH_EXP_FAST) = exp_fast(x);
            *row(MATH_EXP2_APPROX) = exp2_approx(x);
            *row(MATH_TANH_APPROX) = tanh_approx(x);
            *row(MATH_TANH_PRECISE) = tanh_precise(x);
            *row(MATH_RSQRT_APPROX) = rsqrt_approx(x);
            *row(MATH_RSQRT_PRECISE) = rsqrt_precise(x);
            *row(MATH_SQRT_RN) = sqrt_rn(x);
            *row(MATH_RCP_RN) = rcp_rn(x);
            *row(MATH_TO_TF32) = f32::from_bits(to_tf32(x));
            *row(MATH_RCP_APPROX) = rcp_approx(x);
            *row(MATH_LOG2_APPROX) = log2_approx(x);
            *row(MATH_LN_FAST) = ln_fast(x);
        }
        i += grid_stride_x();
    }
}

/// # Safety
/// See the module docs and [`DynamicSharedParams`]; launched with
/// `block_dim * 4` bytes of dynamic shared memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn test_dynamic_shared(p: DynamicSharedParams) {
    let t = thread_idx_x() as usize;
    let bd = block_dim_x() as usize;
    let base = (block_idx_x() * block_dim_x()) as usize;
    // SAFETY: the launch gives bd floats of shared memory; base + t < n.
    unsafe {
        let sh = dynamic_shared::<f32>();
        *sh.add(t) = *p.inp.add(base + t);
        sync_threads();
        // Read another thread's element: only correct after the barrier.
        *p.out.add(base + t) = *sh.add(bd - 1 - t);
        if t == 0 {
            let a = dynamic_shared_align16::<f32>();
            let ok = (a as usize).is_multiple_of(SHARED_ALIGN) && a == sh;
            *p.align_ok.add(block_idx_x() as usize) = ok as u32;
        }
    }
}

/// # Safety
/// See the module docs and [`MmaParams`]; blocks are whole warps.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn test_mma_tf32(p: MmaParams) {
    let tile = global_idx_x() / WARP_SIZE;
    // Uniform per warp: whole warps leave, the rest execute mma together.
    if tile >= p.tiles {
        return;
    }
    let lane = lane_id();
    let (g, t) = ((lane / 4) as usize, (lane % 4) as usize);
    let (m, n, k) = (MMA_M as usize, MMA_N as usize, MMA_K as usize);
    let tile = tile as usize;
    // SAFETY: indices stay inside this tile's M*K, K*N and M*N elements.
    unsafe {
        let a = p.a.add(tile * m * k);
        let b = p.b.add(tile * k * n);
        let c = p.c.add(tile * m * n);
        let d = p.d.add(tile * m * n);
        let ra = |r: usize, col: usize| to_tf32(*a.add(r * k + col));
        let rb = |kk: usize, col: usize| to_tf32(*b.add(kk * n + col));
        let rc = |r: usize, col: usize| *c.add(r * n + col);
        // Fragment layout as documented in gpu_kernels::device::mma.
        let fa = [ra(g, t), ra(g + 8, t), ra(g, t + 4), ra(g + 8, t + 4)];
        let fb = [rb(t, g), rb(t + 4, g)];
        let fc = [rc(g, 2 * t), rc(g, 2 * t + 1), rc(g + 8, 2 * t), rc(g + 8, 2 * t + 1)];
        let fd = mma_m16n8k8_tf32(fa, fb, fc);
        *d.add(g * n + 2 * t) = fd[0];
        *d.add(g * n + 2 * t + 1) = fd[1];
        *d.add((g + 8) * n + 2 * t) = fd[2];
        *d.add((g + 8) * n + 2 * t + 1) = fd[3];
    }
}

/// # Safety
/// See the module docs and [`CpAsyncParams`]; launched with
/// `block_dim * 16` bytes of dynamic shared memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn test_cp_async(p: CpAsyncParams) {
    let t = thread_idx_x() as usize;
    let bd = block_dim_x() as usize;
    let c = global_idx_x();
    let chunk = CP_ASYNC_CHUNK as usize;
    let base = (block_idx_x() * block_dim_x()) as usize;
    // SAFETY: shared memory holds bd chunks, 16-byte aligned; chunk c of
    // `inp` exists when c < valid_chunks; no read happens otherwise (zfill
    // with 0 source bytes); out holds `chunks` chunks and base + bd <= chunks.
    unsafe {
        let sh = dynamic_shared_align16::<f32>();
        let dst = sh.add(t * chunk);
        if c < p.valid_chunks {
            let src = p.inp.add(c as usize * chunk);
            // Both entry points: the plain copy and zfill copying all 16 bytes.
            if t.is_multiple_of(2) {
                cp_async_16(dst, src);
            } else {
                cp_async_16_zfill(dst, src, 16);
            }
        } else {
            cp_async_16_zfill(dst, p.inp, 0);
        }
        cp_async_commit();
        cp_async_wait_group::<0>();
        sync_threads();
        // Write a neighbour's chunk: only correct once everyone's copy landed.
        let j = (t + 1) % bd;
        for e in 0..chunk {
            *p.out.add((base + j) * chunk + e) = *sh.add(j * chunk + e);
        }
    }
}
