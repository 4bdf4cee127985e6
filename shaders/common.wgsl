// Shared by every kernel family (the kernels layer puts it where a family says COMMON): the
// family's metadata struct, generated from its Rust definition (src/kernels/meta.rs), bound at 0.
{{META}}
@group(0) @binding(0) var<storage, read> info: {{META_TYPE}};
