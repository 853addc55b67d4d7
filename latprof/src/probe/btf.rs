//! Just enough of a BTF reader to find struct member offsets in the running kernel's
//! /sys/kernel/btf/vmlinux (aya's Btf does not expose member lookup).
use anyhow::{Context as _, Result, anyhow, bail};

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;

struct Type {
    name_off: u32,
    kind: u32,
    kind_flag: bool,
    /// Byte offset of the member array (struct/union only).
    members_at: usize,
    vlen: usize,
}

pub struct Btf {
    data: Vec<u8>,
    strings: usize,
    strings_len: usize,
    types: Vec<Type>,
}

fn u32_at(data: &[u8], at: usize) -> Result<u32> {
    let bytes = data
        .get(at..at + 4)
        .ok_or_else(|| anyhow!("BTF truncated at {at}"))?;
    Ok(u32::from_le_bytes(bytes.try_into()?))
}

impl Btf {
    pub fn from_sys_fs() -> Result<Self> {
        let data = std::fs::read("/sys/kernel/btf/vmlinux")
            .context("reading /sys/kernel/btf/vmlinux (latprof needs a kernel with BTF)")?;
        Self::parse(data)
    }

    pub fn parse(data: Vec<u8>) -> Result<Self> {
        if data.len() < 24 || u16::from_le_bytes([data[0], data[1]]) != BTF_MAGIC {
            bail!("not little-endian BTF");
        }
        let hdr_len = u32_at(&data, 4)? as usize;
        let type_off = u32_at(&data, 8)? as usize;
        let type_len = u32_at(&data, 12)? as usize;
        let str_off = u32_at(&data, 16)? as usize;
        let str_len = u32_at(&data, 20)? as usize;
        let mut types = vec![Type {
            name_off: 0,
            kind: 0,
            kind_flag: false,
            members_at: 0,
            vlen: 0,
        }];
        let mut at = hdr_len + type_off;
        let end = at + type_len;
        while at < end {
            let name_off = u32_at(&data, at)?;
            let info = u32_at(&data, at + 4)?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            at += 12;
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                _ => 0,
            };
            types.push(Type {
                name_off,
                kind,
                kind_flag: info >> 31 == 1,
                members_at: at,
                vlen,
            });
            at += extra;
        }
        Ok(Self {
            data,
            strings: hdr_len + str_off,
            strings_len: str_len,
            types,
        })
    }

    fn name(&self, off: u32) -> &str {
        let start = self.strings + off as usize;
        let limit = (self.strings + self.strings_len).min(self.data.len());
        let Some(bytes) = self.data.get(start..limit) else {
            return "";
        };
        let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        std::str::from_utf8(&bytes[..len]).unwrap_or("")
    }

    /// Byte offset of `member` in `struct name`, looking through anonymous structs and unions.
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u32> {
        let id = self
            .struct_index(name)
            .ok_or_else(|| anyhow!("BTF has no struct {name}"))?;
        self.find_member(id, member, 0)?
            .ok_or_else(|| anyhow!("BTF: struct {name} has no member {member}"))
    }

    fn find_member(&self, id: usize, member: &str, base_bits: u32) -> Result<Option<u32>> {
        let t = &self.types[id];
        for i in 0..t.vlen {
            let at = t.members_at + 12 * i;
            let m_name = u32_at(&self.data, at)?;
            let m_type = u32_at(&self.data, at + 4)? as usize;
            let raw = u32_at(&self.data, at + 8)?;
            let bits = base_bits + if t.kind_flag { raw & 0x00ff_ffff } else { raw };
            let m_name = self.name(m_name);
            if m_name == member {
                return Ok(Some(bits / 8));
            }
            if m_name.is_empty() {
                let inner = self.resolve(m_type);
                if matches!(
                    self.types.get(inner).map(|t| t.kind),
                    Some(KIND_STRUCT | KIND_UNION)
                ) && let Some(found) = self.find_member(inner, member, bits)?
                {
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }

    /// Number of parameters of the function pointer type `typedef_name` (the raw tracepoint
    /// prototypes are typedefs like `btf_trace_sched_switch`, whose first parameter is the
    /// tracepoint's private data).
    pub fn fn_pointer_arity(&self, typedef_name: &str) -> Result<usize> {
        let id = self
            .types
            .iter()
            .position(|t| t.kind == KIND_TYPEDEF && self.name(t.name_off) == typedef_name)
            .ok_or_else(|| anyhow!("BTF has no {typedef_name}"))?;
        let ptr = self.resolve(id);
        let proto = match self.types.get(ptr) {
            Some(t) if t.kind == KIND_PTR => u32_at(&self.data, t.members_at - 4)? as usize,
            _ => bail!("BTF: {typedef_name} is not a function pointer"),
        };
        match self.types.get(self.resolve(proto)) {
            Some(t) if t.kind == KIND_FUNC_PROTO => Ok(t.vlen),
            _ => bail!("BTF: {typedef_name} is not a function pointer"),
        }
    }

    /// Size in bytes of `struct name`.
    pub fn struct_size(&self, name: &str) -> Result<u32> {
        let id = self
            .struct_index(name)
            .ok_or_else(|| anyhow!("BTF has no struct {name}"))?;
        u32_at(&self.data, self.types[id].members_at - 4)
    }

    /// The index (type id) of `struct name`'s definition (not a forward declaration, which
    /// has no members).
    fn struct_index(&self, name: &str) -> Option<usize> {
        self.types
            .iter()
            .position(|t| t.kind == KIND_STRUCT && t.vlen > 0 && self.name(t.name_off) == name)
    }

    /// The id of the function `name` (a kfunc's, where the kernel has it): what a kfunc call
    /// names it by.
    #[must_use]
    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.types
            .iter()
            .position(|t| t.kind == KIND_FUNC && self.name(t.name_off) == name)
            .and_then(|id| u32::try_from(id).ok())
    }

    /// The id of `struct name`'s definition.
    #[must_use]
    pub fn struct_id(&self, name: &str) -> Option<u32> {
        self.struct_index(name)
            .and_then(|id| u32::try_from(id).ok())
    }

    /// Whether some enum of the kernel has the enumerator `name` (e.g. `BPF_FUNC_loop` in
    /// `enum bpf_func_id`: the helpers this kernel knows).
    #[must_use]
    pub fn has_enumerator(&self, name: &str) -> bool {
        self.types.iter().filter(|t| t.kind == KIND_ENUM).any(|t| {
            (0..t.vlen).any(|i| {
                u32_at(&self.data, t.members_at + 8 * i).is_ok_and(|off| self.name(off) == name)
            })
        })
    }

    /// Offset of the per-CPU variable `name` in the per-CPU section (`.data..percpu`), where
    /// the BTF describes per-CPU variables (pahole 1.16 and later; Debian 11's does not).
    #[must_use]
    pub fn percpu_var_offset(&self, name: &str) -> Option<u32> {
        let sec = self
            .types
            .iter()
            .find(|t| t.kind == KIND_DATASEC && self.name(t.name_off) == ".data..percpu")?;
        (0..sec.vlen).find_map(|i| {
            let at = sec.members_at + 12 * i;
            let var = u32_at(&self.data, at).ok()? as usize;
            let offset = u32_at(&self.data, at + 4).ok()?;
            let t = self.types.get(var)?;
            (t.kind == KIND_VAR && self.name(t.name_off) == name).then_some(offset)
        })
    }

    /// Follows typedefs and qualifiers (kinds 8-11, 18) to the underlying type.
    fn resolve(&self, mut id: usize) -> usize {
        for _ in 0..16 {
            let Some(t) = self.types.get(id) else {
                return id;
            };
            if !matches!(t.kind, 8..=11 | 18) {
                return id;
            }
            let at = t.members_at - 4;
            id = u32_at(&self.data, at).map_or(id, |v| v as usize);
        }
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds BTF with `struct s { int a; union { long b; }; }`,
    /// `typedef void (*fp)(void *, int, long)` and a function `a` by hand.
    fn sample() -> Vec<u8> {
        let strings = b"\0s\0a\0b\0int\0long\0fp\0E_ONE\0.data..percpu\0";
        let mut types = Vec::new();
        let mut push = |words: &[u32]| {
            for w in words {
                types.extend_from_slice(&w.to_le_bytes());
            }
        };
        // 1: int
        push(&[7, KIND_INT << 24, 4, 32]);
        // 2: long
        push(&[11, KIND_INT << 24, 8, 64]);
        // 3: anonymous union { long b; }
        push(&[0, (KIND_UNION << 24) | 1, 8, 5, 2, 0]);
        // 4: struct s { int a; <anon> at 64 bits; }
        push(&[1, (KIND_STRUCT << 24) | 2, 16, 3, 1, 0, 0, 3, 64]);
        // 5: func proto (void *, int, long); 6: pointer to it; 7: typedef fp
        push(&[0, (KIND_FUNC_PROTO << 24) | 3, 0, 0, 0, 0, 1, 0, 2]);
        push(&[0, KIND_PTR << 24, 5]);
        push(&[16, KIND_TYPEDEF << 24, 6]);
        // 8: enum { E_ONE = 1 } (anonymous)
        push(&[0, (KIND_ENUM << 24) | 1, 4, 19, 1]);
        // 9: var int a (per-CPU); 10: datasec .data..percpu { a at 64 }
        push(&[3, KIND_VAR << 24, 1, 0]);
        push(&[25, (KIND_DATASEC << 24) | 1, 0, 9, 64, 4]);
        // 11: function a (of prototype 5)
        push(&[3, KIND_FUNC << 24, 5]);
        let mut data = Vec::new();
        data.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        data.extend_from_slice(&[1, 0]);
        let len = |v: &[u8]| u32::try_from(v.len()).expect("a small test BTF");
        for w in [24u32, 0, len(&types), len(&types), len(strings)] {
            data.extend_from_slice(&w.to_le_bytes());
        }
        data.extend_from_slice(&types);
        data.extend_from_slice(strings);
        data
    }

    #[test]
    fn finds_direct_and_anonymous_members() {
        let btf = Btf::parse(sample()).unwrap();
        assert_eq!(btf.member_offset("s", "a").unwrap(), 0);
        assert_eq!(btf.member_offset("s", "b").unwrap(), 8);
        assert!(btf.member_offset("s", "c").is_err());
        assert!(btf.member_offset("t", "a").is_err());
        assert_eq!(btf.struct_size("s").unwrap(), 16);
        assert!(btf.struct_size("t").is_err());
    }

    #[test]
    fn counts_function_pointer_parameters() {
        let btf = Btf::parse(sample()).unwrap();
        assert_eq!(btf.fn_pointer_arity("fp").unwrap(), 3);
        assert!(btf.fn_pointer_arity("s").is_err());
        assert!(btf.fn_pointer_arity("nope").is_err());
    }

    #[test]
    fn finds_enumerators() {
        let btf = Btf::parse(sample()).unwrap();
        assert!(btf.has_enumerator("E_ONE"));
        assert!(!btf.has_enumerator("E_TWO"));
        assert!(!btf.has_enumerator("s"));
    }

    #[test]
    fn finds_per_cpu_variables() {
        let btf = Btf::parse(sample()).unwrap();
        assert_eq!(btf.percpu_var_offset("a"), Some(64));
        assert_eq!(btf.percpu_var_offset("b"), None);
    }

    #[test]
    fn finds_functions_and_structs_by_id() {
        let btf = Btf::parse(sample()).unwrap();
        assert_eq!(btf.func_id("a"), Some(11));
        assert_eq!(btf.func_id("s"), None);
        assert_eq!(btf.struct_id("s"), Some(4));
        assert_eq!(btf.struct_id("a"), None);
    }

    #[test]
    fn rejects_garbage() {
        assert!(Btf::parse(vec![0; 10]).is_err());
        assert!(Btf::parse(vec![0xff; 64]).is_err());
    }
}
