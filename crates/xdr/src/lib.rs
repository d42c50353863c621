//! XDR and ONC RPC record marking; LDM-6/7 message types (parse/emit).
