//! Launching a [`Function`]: the checks made before the driver is called, and the launch
//! itself, under the stream's order lock.

use crate::{Error, Function, KernelArgs, LaunchConfig, Result, Stream};

impl Function<'_> {
    /// Enqueues the kernel on `stream` with `args`, and returns at once (also inside a
    /// graph capture, which then launches it at every replay).
    ///
    /// Before the driver is called, and with nothing enqueued if one fails: the shape is
    /// checked (no zero dimension, at most
    /// [`max_threads_per_block`](Self::max_threads_per_block) threads:
    /// [`Error::InvalidLaunchConfig`]), the stream must be of the function's context
    /// ([`Error::WrongDevice`]), and, when the driver can tell (≥ 12.4), the number and
    /// sizes of the arguments must match the kernel's parameters
    /// ([`Error::KernelArgumentCount`], [`Error::KernelArgumentSize`]). Device memory
    /// given as an argument must be of the same context too.
    ///
    /// Every buffer or view given is noted as used on `stream` and the code is held like
    /// memory: dropping either right after the launch waits for the kernel, and a capture
    /// keeps both for its graph (see the crate's Safety section). The whole launch is made
    /// under the stream's [`enqueue_lock`](Stream::enqueue_lock).
    ///
    /// # Safety
    /// No type system can check a kernel, so the caller vouches for what it does with
    /// these arguments: each argument is what the kernel's parameter expects (type and
    /// meaning, e.g. a `u64` length, not a count of bytes when elements are meant); the
    /// kernel reads and writes only the device memory it is given, within its bounds,
    /// and writes only memory given mutably (`&mut` or a [`DeviceViewMut`](crate::DeviceViewMut))
    /// or that it owns; and it does not make other work of the device misbehave (an
    /// infinite loop, a trap). The shape must suit the kernel (e.g. it checks its index
    /// against the length, if the grid covers more threads than elements). Memory the
    /// kernel reaches other than through buffers and views (an address passed as a `u64`
    /// or inside a [`ByValue`](crate::ByValue) struct) is not tracked: the caller keeps it
    /// allocated for as long as the kernel, or a graph that captured it, may run.
    ///
    /// Mistakes the crate can see are typed errors, and nothing is launched:
    ///
    /// ```
    /// use cuda_hal::{DeviceBuffer, Error, LaunchConfig, Module, Stream};
    /// # let ptx = ".version 8.0\n.target sm_90\n.visible .entry scale(.param .u64 p, .param .u64 n, .param .f32 by) { ret; }\n";
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).kernel("scale", &[8, 8, 4], |k| {
    /// #     let (p, n, by) = (k.param::<u64>(0), k.param::<u64>(1), k.param::<f32>(2));
    /// #     let v: Vec<f32> = k.read::<f32>(p, n as usize).iter().map(|x| x * by).collect();
    /// #     k.write(p, &v);
    /// # }).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// // scale(p: *mut f32, n: u64, by: f32) multiplies n floats at p by `by`.
    /// let module = Module::from_ptx(&ctx, ptx)?;
    /// let scale = module.function("scale")?;
    /// let stream = Stream::new(&ctx)?;
    /// let mut data = DeviceBuffer::from_slice(&ctx, &[1.0f32, 2.0])?;
    /// // SAFETY: `scale` reads and writes 2 floats at its first argument.
    /// unsafe { scale.launch(&stream, LaunchConfig::linear(1, 32), (&mut data, 2u64, 3.0f32)) }?;
    /// stream.synchronize()?;
    /// assert_eq!(data.to_vec()?, [3.0, 6.0]);
    ///
    /// // SAFETY: refused before the driver is called (and the simulated kernel's memory
    /// // accesses are checked anyway).
    /// let too_few = unsafe { scale.launch(&stream, LaunchConfig::linear(1, 32), (&mut data, 2u64)) };
    /// assert_eq!(too_few, Err(Error::KernelArgumentCount { kernel: "scale".into(), expected: 3, got: 2 }));
    /// // `n` as a u32 where the kernel takes 8 bytes.
    /// // SAFETY: refused before the driver is called (and the simulated kernel's memory
    /// // accesses are checked anyway).
    /// let narrow = unsafe { scale.launch(&stream, LaunchConfig::linear(1, 32), (&mut data, 2u32, 3.0f32)) };
    /// assert!(matches!(narrow, Err(Error::KernelArgumentSize { index: 1, expected: 8, got: 4, .. })));
    /// // SAFETY: refused before the driver is called (and the simulated kernel's memory
    /// // accesses are checked anyway).
    /// let huge = unsafe { scale.launch(&stream, LaunchConfig::linear(1, 2048), (&mut data, 2u64, 3.0f32)) };
    /// assert!(matches!(huge, Err(Error::InvalidLaunchConfig { .. })));
    /// assert_eq!(world.calls("cuLaunchKernel"), 1);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[doc(alias = "cuLaunchKernel")]
    pub unsafe fn launch<A: KernelArgs>(
        &self,
        stream: &Stream,
        config: LaunchConfig,
        args: A,
    ) -> Result<()> {
        self.check_config(&config)?;
        stream.same_context(&self.ctx, "Function::launch")?;
        self.check_args(A::SIZES)?;
        // From the first note to the launch: no capture begins or ends in between, so a
        // capture that records the launch holds what it uses.
        let _order = stream.enqueue_lock();
        self.code.used_on(stream)?;
        let mut raw = args.prepare(stream)?;
        let mut pointers = A::pointers(&mut raw);
        let _g = stream.bind_if_legacy()?;
        let [gx, gy, gz] = config.grid;
        let [bx, by, bz] = config.block;
        // SAFETY: a function of loaded code (borrowed, and held for the launch by
        // `used_on`) on a stream of its context; one pointer per parameter, each to a
        // value of the parameter's size (checked above when the driver can tell), alive
        // until the call returns (the driver copies them); no `extra`. Device memory in
        // the arguments is of this context and kept allocated for the kernel by `prepare`.
        // What the kernel does with them is the caller's contract.
        let launched = unsafe {
            call!(
                self.ctx.cuda(),
                cuLaunchKernel(
                    self.raw,
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    config.shared_mem_bytes,
                    stream.as_raw(),
                    pointers.as_mut().as_mut_ptr(),
                    std::ptr::null_mut()
                )
            )
        };
        // Still borrowed: owners of the memory hear of the launch.
        args.enqueued(stream);
        launched
    }

    fn check_config(&self, config: &LaunchConfig) -> Result<()> {
        let bad = |problem: String| Error::InvalidLaunchConfig {
            kernel: self.name().to_string(),
            config: *config,
            problem,
        };
        if config.grid.contains(&0) {
            return Err(bad("the grid has a dimension of 0 blocks".into()));
        }
        if config.block.contains(&0) {
            return Err(bad("the block has a dimension of 0 threads".into()));
        }
        let max = self.max_threads_per_block()?;
        let threads = config.threads_per_block();
        if threads > u64::from(max) {
            return Err(bad(format!(
                "{threads} threads per block; the kernel allows at most {max}"
            )));
        }
        Ok(())
    }

    fn check_args(&self, sizes: &[usize]) -> Result<()> {
        let Some(params) = self.param_sizes()? else {
            return Ok(());
        };
        if params.len() != sizes.len() {
            return Err(Error::KernelArgumentCount {
                kernel: self.name().to_string(),
                expected: params.len(),
                got: sizes.len(),
            });
        }
        match params.iter().zip(sizes).position(|(p, a)| p != a) {
            Some(index) => Err(Error::KernelArgumentSize {
                kernel: self.name().to_string(),
                index,
                expected: params[index],
                got: sizes[index],
            }),
            None => Ok(()),
        }
    }
}
