//! One client's GPU session: device, primary context, the loaded `spin` kernel, and launches.

use std::ffi::c_void;

use crate::driver::{CuDevice, CuDevicePtr, CuError, Driver, Handle, ATTR_CLOCK_RATE, ATTR_MULTIPROCESSOR_COUNT};
use crate::ptx::{SPIN_ENTRY, SPIN_PTX};

/// What a session learned about its device.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Ordinal passed with `--device`.
    pub ordinal: i32,
    /// `cuDeviceGetName`.
    pub name: String,
    /// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
    pub sm_count: u32,
    /// `CU_DEVICE_ATTRIBUTE_CLOCK_RATE` in kHz.
    pub clock_khz: u32,
    /// `cuDriverGetVersion`.
    pub driver_version: i32,
}

impl DeviceInfo {
    /// SM clock cycles that take `us` microseconds at the device's rated clock.
    pub fn cycles_for_us(&self, us: f64) -> u64 {
        (us * self.clock_khz as f64 / 1000.0).round().max(1.0) as u64
    }
}

/// A context on one device with the `spin` kernel loaded. Dropping it frees, unloads and
/// releases the context, so a client never dies holding a live context by accident.
pub struct Session {
    drv: Driver,
    dev: CuDevice,
    module: Handle,
    spin: Handle,
    buffers: Vec<CuDevicePtr>,
    /// What the session learned about its device.
    pub info: DeviceInfo,
}

impl Session {
    /// Loads the driver, initialises it, retains device `ordinal`'s primary context and loads
    /// the `spin` PTX module.
    pub fn open(ordinal: i32) -> Result<Self, CuError> {
        let drv = Driver::load()?;
        drv.init()?;
        let count = drv.device_count()?;
        if ordinal < 0 || ordinal >= count {
            return Err(CuError {
                call: format!("--device {ordinal}"),
                code: 101,
                name: format!("CUDA_ERROR_INVALID_DEVICE: the driver reports {count} device(s)"),
            });
        }
        let dev = drv.device(ordinal)?;
        let info = DeviceInfo {
            ordinal,
            name: drv.device_name(dev)?,
            sm_count: drv.device_attribute(dev, ATTR_MULTIPROCESSOR_COUNT)?.max(1) as u32,
            clock_khz: drv.device_attribute(dev, ATTR_CLOCK_RATE)?.max(1) as u32,
            driver_version: drv.driver_version()?,
        };
        let ctx = drv.primary_ctx_retain(dev)?;
        let mut s = Session { drv, dev, module: std::ptr::null_mut(), spin: std::ptr::null_mut(), buffers: Vec::new(), info };
        s.drv.ctx_set_current(ctx)?;
        s.module = s.drv.module_load_ptx(SPIN_PTX)?;
        s.spin = s.drv.module_get_function(s.module, SPIN_ENTRY)?;
        Ok(s)
    }

    /// The loaded driver, for calls the session does not wrap.
    pub fn driver(&self) -> &Driver {
        &self.drv
    }

    /// Launches `spin(cycles)` on `blocks` blocks of `threads` threads (asynchronous).
    pub fn launch_spin(&self, blocks: u32, threads: u32, cycles: u64) -> Result<(), CuError> {
        let mut cycles = cycles;
        let mut params = [(&mut cycles as *mut u64).cast::<c_void>()];
        self.drv.launch(self.spin, [blocks.max(1), 1, 1], [threads.max(1), 1, 1], &mut params)
    }

    /// `cuCtxSynchronize`: waits for every launched kernel.
    pub fn synchronize(&self) -> Result<(), CuError> {
        self.drv.ctx_synchronize()
    }

    /// Allocates `bytes` of device memory owned by the session (freed on drop).
    pub fn alloc(&mut self, bytes: usize) -> Result<CuDevicePtr, CuError> {
        let p = self.drv.mem_alloc(bytes)?;
        self.buffers.push(p);
        Ok(p)
    }

    /// Frees everything, unloads the module and releases the primary context, reporting the
    /// first error (drop does the same silently).
    pub fn close(mut self) -> Result<(), CuError> {
        self.release()
    }

    fn release(&mut self) -> Result<(), CuError> {
        let mut first = Ok(());
        for p in self.buffers.drain(..) {
            let r = self.drv.mem_free(p);
            if first.is_ok() {
                first = r;
            }
        }
        if !self.module.is_null() {
            let r = self.drv.module_unload(self.module);
            self.module = std::ptr::null_mut();
            if first.is_ok() {
                first = r;
            }
        }
        if self.dev >= 0 {
            let r = self.drv.primary_ctx_release(self.dev);
            self.dev = -1;
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.release();
    }
}
