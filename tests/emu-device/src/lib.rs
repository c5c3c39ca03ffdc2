//! The emulated GPU: device profiles and the physics shared by all emulator processes through one state file.
