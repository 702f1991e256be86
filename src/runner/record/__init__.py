"""What a run leaves behind and how a person reads it: result.json and tensors.h5 (result), the
machine and versions it ran with (environment, setups), the columns of its table (table)."""
