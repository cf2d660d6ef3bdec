//! Fusing the views of the ranks on one host into one `<system>` (NCCL's `ncclTopoFuseXml`).
//!
//! Each rank contributes what it sees: on a GPU, its own GPU by detection (NVML and sysfs, fused
//! into `RSCCL_TOPO_FILE` when set); on the CPU emulator, the topology file with its GPU chosen
//! by `dev`. A rank's view names its own GPU with a `rank` attribute and no other GPU. The union
//! of the views, element by element, is the host: two elements are the same when their names and
//! identifying attributes (bus id, NUMA id, NVLink target, …) agree; the first view's attributes
//! win and missing ones are added, so every GPU ends up with the rank of the rank that drives it.
use super::xml::XmlNode;

/// What identifies an element among its siblings: its name and, for elements that can repeat
/// under one parent, the attribute that tells them apart (the whole attribute list when there
/// is none, so only identical elements merge).
fn key(n: &XmlNode) -> (String, String) {
    let by = |a: &str| n.attr(a).unwrap_or("").to_ascii_lowercase();
    let id = match n.name.as_str() {
        "cpu" => format!("{}/{}", by("numaid"), by("host_hash")),
        "pci" => by("busid"),
        "nvlink" | "pcilink" => by("target"),
        "net" => format!("{}/{}", by("name"), by("dev")),
        // At most one of each under a `<pci>`; the system is the root.
        "gpu" | "nic" | "system" => String::new(),
        _ => n.attrs.iter().map(|(k, v)| format!("{k}={v};")).collect(),
    };
    (n.name.clone(), id)
}

/// Adds `other` into `base` (both the same element): attributes `base` lacks, and children it
/// lacks, recursively. Depth is that of the parsed files, which the XML reader bounds.
pub fn fuse(base: &mut XmlNode, other: &XmlNode) {
    for (k, v) in &other.attrs {
        if base.attr(k).is_none() {
            base.set_attr(k, v.clone());
        }
    }
    for child in &other.children {
        let want = key(child);
        match base.children.iter_mut().find(|c| key(c) == want) {
            Some(mine) => fuse(mine, child),
            None => base.children.push(child.clone()),
        }
    }
}

/// Removes the `rank` attribute of every `<gpu>` under `root` except those `keep` accepts
/// (by the bus id of the `<pci>` that holds the GPU): NCCL ignores a GPU without a rank, so a
/// rank's view names only the GPU it drives.
pub fn keep_ranked_gpus(root: &mut XmlNode, keep: &dyn Fn(&str) -> bool) {
    if root.name == "pci" {
        let busid = root.attr("busid").unwrap_or("").to_string();
        if let Some(g) = root.children.iter_mut().find(|c| c.name == "gpu") {
            if !keep(&busid) {
                g.attrs.retain(|(k, _)| k != "rank");
            }
        }
    }
    for c in &mut root.children {
        keep_ranked_gpus(c, keep);
    }
}

/// The `<gpu>` elements under `root` with the bus id of their `<pci>`, in document order.
pub fn gpus(root: &XmlNode) -> Vec<(String, &XmlNode)> {
    let mut out = Vec::new();
    root.walk(&mut |n| {
        if n.name == "pci" {
            if let Some(g) = n.child("gpu") {
                out.push((n.attr("busid").unwrap_or("").to_string(), g));
            }
        }
    });
    out
}

/// Visits every `<gpu>` under `root` mutably, with the bus id of its `<pci>`.
pub fn for_each_gpu_mut(root: &mut XmlNode, f: &mut dyn FnMut(&str, &mut XmlNode)) {
    if root.name == "pci" {
        let busid = root.attr("busid").unwrap_or("").to_string();
        if let Some(g) = root.children.iter_mut().find(|c| c.name == "gpu") {
            f(&busid, g);
        }
    }
    for c in &mut root.children {
        for_each_gpu_mut(c, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::xml;

    const SYS: &str = r#"<system version="1">
  <cpu numaid="0" affinity="ff" arch="x86_64">
    <pci busid="0000:07:00.0" class="0x030200" link_speed="16 GT/s" link_width="16">
      <gpu dev="0" sm="80" rank="0" gdr="1"><nvlink target="0000:0f:00.0" count="4" tclass="0x030200"/></gpu>
    </pci>
    <pci busid="0000:0f:00.0" class="0x030200" link_speed="16 GT/s" link_width="16">
      <gpu dev="1" sm="80" rank="1" gdr="1"><nvlink target="0000:07:00.0" count="4" tclass="0x030200"/></gpu>
    </pci>
  </cpu>
</system>"#;

    fn view(keep: &str, rank: u32) -> XmlNode {
        let mut root = xml::parse(SYS, "t").unwrap().root;
        for_each_gpu_mut(&mut root, &mut |b, g| {
            if b == keep {
                g.set_attr("rank", rank.to_string());
            }
        });
        keep_ranked_gpus(&mut root, &|b| b == keep);
        root
    }

    #[test]
    fn two_views_of_one_file_fuse_into_both_gpus_with_their_ranks() {
        let mut base = view("0000:0f:00.0", 5);
        fuse(&mut base, &view("0000:07:00.0", 2));
        let ranks: Vec<(String, Option<String>)> =
            gpus(&base).into_iter().map(|(b, g)| (b, g.attr("rank").map(str::to_string))).collect();
        assert_eq!(
            ranks,
            [
                ("0000:07:00.0".to_string(), Some("2".to_string())),
                ("0000:0f:00.0".to_string(), Some("5".into()))
            ]
        );
        // Nothing duplicated: still one cpu, two pci, one nvlink each.
        assert_eq!(base.children.len(), 1);
        assert_eq!(base.children[0].children.len(), 2);
        for p in &base.children[0].children {
            assert_eq!(p.child("gpu").unwrap().children.len(), 1);
        }
    }

    #[test]
    fn views_that_each_see_one_gpu_fuse_into_a_tree_with_both() {
        // Detection on two processes: each sees only its own GPU under the same CPU.
        let mut a = view("0000:07:00.0", 0);
        a.children[0].children.retain(|p| p.attr("busid") == Some("0000:07:00.0"));
        let mut b = view("0000:0f:00.0", 1);
        b.children[0].children.retain(|p| p.attr("busid") == Some("0000:0f:00.0"));
        fuse(&mut a, &b);
        assert_eq!(gpus(&a).len(), 2);
        assert_eq!(a.children.len(), 1, "the CPU (same numaid) is one");
    }

    #[test]
    fn a_view_unranks_every_gpu_but_its_own() {
        let v = view("0000:07:00.0", 3);
        let ranks: Vec<Option<&str>> = gpus(&v).into_iter().map(|(_, g)| g.attr("rank")).collect();
        assert_eq!(ranks, [Some("3"), None]);
    }
}
