//! What carries hops between ranks on separate devices: host memory both
//! devices import (mapped), or staging; which one a world took, and why,
//! and that both give the shared device's bits.

mod common;

use common::{bits, user_adapter};
use wgpu_collectives::{
    Error, HostLink, Placement, Plan, ReduceOp, Tune, World, WorldConfig, request_device, wgpu,
};

const N: usize = 3;
/// Elements per rank: divisible by the ranks, and not a multiple of a
/// slice or a unit, so that the last pieces are short.
const LEN: usize = N * 4099;

/// Floats whose sum depends on the order it is folded in.
fn values(rank: usize, salt: u64) -> Vec<f32> {
    (0..LEN)
        .map(|i| {
            let b = bits(rank, i, salt);
            let mag = f32::from_bits((b & 0x007f_ffff) | ((120 + (b >> 24) % 16) << 23));
            if b & 1 == 0 { mag } else { -mag }
        })
        .collect()
}

/// Every rank's bits of an all-reduce, a reduce-scatter, an all-gather
/// and a broadcast, in that order.
fn outputs(w: &World) -> Vec<Vec<u32>> {
    w.run(|c| -> Result<Vec<u32>, Error> {
        let x = c.tensor(&values(c.rank(), 7))?;
        let mut got = Vec::new();
        for t in [
            c.all_reduce(&x, ReduceOp::Sum)?.wait()?,
            c.reduce_scatter(&x, ReduceOp::Sum)?.wait()?,
            c.all_gather(&x)?.wait()?,
            c.broadcast(&x, 1)?.wait()?,
        ] {
            got.extend(t.to_vec::<f32>()?.iter().map(|v| v.to_bits()));
        }
        Ok(got)
    })
    .expect("run")
    .into_iter()
    .enumerate()
    .map(|(rank, r)| r.unwrap_or_else(|e| panic!("rank {rank}: {e}")))
    .collect()
}

/// The planner's rules, not a timing, choose where no plan is forced.
fn config(link: HostLink, plan: Option<Plan>) -> WorldConfig {
    WorldConfig::new(N)
        .with_tune(Tune::Off)
        .with_placement(Placement::DevicePerRank)
        .with_host_link(link)
        .with_plan(plan)
}

/// The bits the ranks get sharing one device: the reference every host
/// link must match.
fn shared_bits() -> Vec<Vec<u32>> {
    let w = World::new(
        WorldConfig::new(N)
            .with_tune(Tune::Off)
            .with_placement(Placement::SharedDevice),
    )
    .expect("a shared world");
    outputs(&w)
}

fn assert_same(what: &str, got: &[Vec<u32>], want: &[Vec<u32>]) {
    for (rank, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what}: rank {rank}'s length");
        let at = g.iter().zip(w).position(|(a, b)| a != b);
        assert!(at.is_none(), "{what}: rank {rank} differs at word {at:?}");
    }
}

/// A device opened the way a framework does, without the extension.
fn plain_device(adapter: &wgpu::Adapter) -> (wgpu::Device, wgpu::Queue) {
    pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor::default()))
        .expect("a device")
}

/// Devices the engine makes on a Vulkan adapter import host memory (every
/// current driver has the extension, lavapipe included), and both links,
/// under the planner's rules, the device ring (slots read in place), the
/// host ring (folding in host memory) and the one-shot (folding every
/// rank's slot where it lies), give the shared device's bits.
#[test]
fn mapped_and_staged_links_give_the_shared_devices_bits() {
    let want = shared_bits();
    let vulkan = user_adapter().get_info().backend == wgpu::Backend::Vulkan;
    for plan in [
        None,
        Some(Plan::DeviceRing),
        Some(Plan::HostRing),
        Some(Plan::OneShot),
    ] {
        for link in [HostLink::Auto, HostLink::Mapped, HostLink::Staging] {
            let w = match World::new(config(link, plan)) {
                Ok(w) => w,
                Err(e) => panic!("{link} links, plan {plan:?}: {e}"),
            };
            let took = w.host_link().expect("separate devices have a host link");
            let expected = match link {
                HostLink::Staging => HostLink::Staging,
                _ if vulkan => HostLink::Mapped,
                _ => HostLink::Staging,
            };
            assert_eq!(took, expected, "{link} asked, plan {plan:?}");
            let named = match took {
                HostLink::Mapped => "host memory both devices map",
                _ => "host staging",
            };
            assert!(w.transport().contains(named), "{}", w.transport());
            assert_same(&format!("{link} links, plan {plan:?}"), &outputs(&w), &want);
        }
    }
}

/// Devices opened without the extension: a world on them stages, and
/// says so; forcing the mapped link on them is refused, naming the
/// extension and the helper that opens devices with it.
#[test]
fn devices_opened_without_the_extension_stage_and_say_why() {
    let adapter = user_adapter();
    let devices = || (0..N).map(|_| plain_device(&adapter)).collect::<Vec<_>>();
    let w = World::from_devices(devices(), config(HostLink::Auto, None)).expect("a world");
    assert_eq!(w.host_link(), Some(HostLink::Staging));
    assert!(w.transport().contains("host staging"), "{}", w.transport());
    assert_same("plain devices", &outputs(&w), &shared_bits());
    match World::from_devices(devices(), config(HostLink::Mapped, None)) {
        Err(Error::InvalidArgument { what, .. }) => {
            assert!(what.contains("mapped host links were asked for"), "{what}");
            assert!(
                what.contains("without VK_EXT_external_memory_host")
                    || what.contains("not a Vulkan device"),
                "{what}"
            );
        }
        Err(e) => panic!("expected InvalidArgument, got {e}"),
        Ok(_) => panic!("a mapped world on devices that cannot import"),
    }
}

/// Devices of both kinds in one world: the ones that import lend slots in
/// host memory, which the others read on the host; the world says it
/// stages (not every hop is mapped), and the bits are the shared device's.
#[test]
fn a_world_of_both_kinds_of_device_gives_the_same_bits() {
    let adapter = user_adapter();
    for plan in [None, Some(Plan::DeviceRing), Some(Plan::OneShot)] {
        let devices = (0..N)
            .map(|r| {
                if r == 1 {
                    plain_device(&adapter)
                } else {
                    request_device(&adapter, &wgpu::DeviceDescriptor::default()).expect("a device")
                }
            })
            .collect();
        let w = World::from_devices(devices, config(HostLink::Auto, plan)).expect("a world");
        assert_eq!(w.host_link(), Some(HostLink::Staging), "plan {plan:?}");
        assert_same(
            &format!("mixed devices, plan {plan:?}"),
            &outputs(&w),
            &shared_bits(),
        );
    }
}

/// Ranks that share one device have no host link to speak of.
#[test]
fn a_shared_device_has_no_host_link() {
    let w = World::new(
        WorldConfig::new(N)
            .with_tune(Tune::Off)
            .with_placement(Placement::SharedDevice)
            .with_host_link(HostLink::Mapped),
    )
    .expect("a shared world");
    assert_eq!(w.host_link(), None);
}

/// Each feature alone, and each limit one step past the adapter's: what
/// `request_device` gives is what wgpu's own `adapter.request_device`
/// gives (refused alike, opened alike), and never a panic.
#[test]
fn request_device_refuses_exactly_what_wgpu_refuses() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    let adapter = user_adapter();
    let (features, limits) = (adapter.features(), adapter.limits());
    let mut cases: Vec<(String, wgpu::DeviceDescriptor<'static>)> = Vec::new();
    for f in wgpu::Features::all().iter() {
        let desc = wgpu::DeviceDescriptor {
            required_features: f,
            ..Default::default()
        };
        cases.push((format!("{f:?}"), desc));
    }
    // Every limit, one step worse than the adapter allows: a maximum one
    // more (where it can be), an alignment half as large.
    macro_rules! past {
        ($($name:ident: $dir:tt),* $(,)?) => {$(
            let mut l = limits.clone();
            let have = l.$name;
            let past = if stringify!($dir) == "max" { have.checked_add(1) } else { (have > 1).then(|| have / 2) };
            if let Some(v) = past {
                l.$name = v;
                cases.push((
                    format!("{} = {v} (the adapter has {have})", stringify!($name)),
                    wgpu::DeviceDescriptor { required_limits: l, ..Default::default() },
                ));
            }
        )*};
    }
    past!(
        max_texture_dimension_1d: max, max_texture_dimension_2d: max, max_texture_dimension_3d: max,
        max_texture_array_layers: max, max_bind_groups: max, max_bind_groups_plus_vertex_buffers: max,
        max_bindings_per_bind_group: max, max_dynamic_uniform_buffers_per_pipeline_layout: max,
        max_dynamic_storage_buffers_per_pipeline_layout: max, max_sampled_textures_per_shader_stage: max,
        max_samplers_per_shader_stage: max, max_storage_buffers_per_shader_stage: max,
        max_storage_textures_per_shader_stage: max, max_uniform_buffers_per_shader_stage: max,
        max_binding_array_elements_per_shader_stage: max,
        max_binding_array_acceleration_structure_elements_per_shader_stage: max,
        max_binding_array_sampler_elements_per_shader_stage: max,
        max_uniform_buffer_binding_size: max, max_storage_buffer_binding_size: max,
        max_vertex_buffers: max, max_buffer_size: max, max_vertex_attributes: max,
        max_vertex_buffer_array_stride: max, max_inter_stage_shader_variables: max,
        min_uniform_buffer_offset_alignment: min, min_storage_buffer_offset_alignment: min,
        max_color_attachments: max, max_color_attachment_bytes_per_sample: max,
        max_compute_workgroup_storage_size: max, max_compute_invocations_per_workgroup: max,
        max_compute_workgroup_size_x: max, max_compute_workgroup_size_y: max,
        max_compute_workgroup_size_z: max, max_compute_workgroups_per_dimension: max,
        max_immediate_size: max, max_non_sampler_bindings: max,
        max_task_workgroup_total_count: max, max_task_workgroups_per_dimension: max,
        max_mesh_workgroup_total_count: max, max_mesh_workgroups_per_dimension: max,
        max_task_invocations_per_workgroup: max, max_task_invocations_per_dimension: max,
        max_mesh_invocations_per_workgroup: max, max_mesh_invocations_per_dimension: max,
        max_mesh_output_vertices: max, max_mesh_output_primitives: max,
        max_mesh_output_layers: max, max_mesh_multiview_view_count: max,
        max_blas_primitive_count: max, max_blas_geometry_count: max, max_tlas_instance_count: max,
        max_acceleration_structures_per_shader_stage: max,
        max_buffers_and_acceleration_structures_per_shader_stage: max,
        max_multiview_view_count: max, max_task_payload_size: max,
        max_ray_dispatch_count: max, max_ray_recursion_depth: max,
    );
    // Within the adapter's limits and features: opened by both.
    cases.push((
        "the adapter's own limits and features (non-experimental)".into(),
        wgpu::DeviceDescriptor {
            required_features: features - wgpu::Features::all_experimental_mask(),
            required_limits: limits.clone(),
            ..Default::default()
        },
    ));
    let mut refused = 0;
    for (what, desc) in &cases {
        let theirs = pollster::block_on(adapter.request_device(desc));
        let ours = catch_unwind(AssertUnwindSafe(|| request_device(&adapter, desc)))
            .unwrap_or_else(|_| panic!("request_device panicked on {what}"));
        assert_eq!(
            ours.is_ok(),
            theirs.is_ok(),
            "{what}: ours {:?}, wgpu's {:?}",
            ours.as_ref().err(),
            theirs.as_ref().err()
        );
        if let Ok((d, _)) = &ours {
            assert!(
                d.features().contains(desc.required_features),
                "{what}: the device lacks what was asked"
            );
            assert!(
                features.contains(d.features()),
                "{what}: the device claims {:?}, which the adapter lacks",
                d.features() - features
            );
            let mut over = Vec::new();
            d.limits()
                .check_limits_with_fail_fn(&limits, false, |name, _, _| over.push(name));
            assert!(
                over.is_empty(),
                "{what}: the device claims limits past the adapter's: {over:?}"
            );
        } else {
            refused += 1;
        }
    }
    // The cases are not vacuous: most ask for what the adapter lacks.
    assert!(
        refused > cases.len() / 2,
        "only {refused} of {} refused",
        cases.len()
    );
}
