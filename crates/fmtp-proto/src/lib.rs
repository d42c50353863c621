//! Sans-IO FMTP v3 codec, sender and receiver state machines.
