//! ldm7 beside the reference builds (Unidata LDM 6.15 with `LDM_REF_BIN`: the two feeding each other, a site migrated, the reference LDM-7 with `LDM7_REF_BIN`; each test skips without its build).

mod migration;
mod reference;
mod reference7;
