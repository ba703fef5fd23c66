/work/main/target-old/release/deps/encoder_cache.d: src/lib.rs src/cache.rs src/cache/eviction.rs src/cache/state.rs src/encoder_decoder.rs src/step.rs src/bindings/mod.rs src/bindings/encoder_decoder.rs src/bindings/floor.rs src/bindings/manager.rs src/bindings/records.rs src/bindings/request.rs src/bindings/state.rs src/bindings/step.rs

/work/main/target-old/release/deps/libencoder_cache.so: src/lib.rs src/cache.rs src/cache/eviction.rs src/cache/state.rs src/encoder_decoder.rs src/step.rs src/bindings/mod.rs src/bindings/encoder_decoder.rs src/bindings/floor.rs src/bindings/manager.rs src/bindings/records.rs src/bindings/request.rs src/bindings/state.rs src/bindings/step.rs

src/lib.rs:
src/cache.rs:
src/cache/eviction.rs:
src/cache/state.rs:
src/encoder_decoder.rs:
src/step.rs:
src/bindings/mod.rs:
src/bindings/encoder_decoder.rs:
src/bindings/floor.rs:
src/bindings/manager.rs:
src/bindings/records.rs:
src/bindings/request.rs:
src/bindings/state.rs:
src/bindings/step.rs:
