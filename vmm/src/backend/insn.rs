//! What one guest instruction does, as far as the counted events care: decoded with iced-x86
//! from the bytes at RIP before it executes, then completed with where execution went.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic,
    OpAccess, OpKind, Register,
};

/// Longest x86 instruction.
pub const MAX_INSN_LEN: usize = 15;

/// The kind of control transfer an instruction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchKind {
    /// Not a branch.
    None,
    /// Conditional jump (Jcc, JRCXZ, LOOPcc).
    Conditional,
    /// Unconditional direct or indirect near jump.
    Jump,
    /// Near call (direct or indirect).
    NearCall,
    /// Near return.
    NearReturn,
    /// Far transfer, IRET, SYSCALL/SYSRET, INT n and friends.
    Far,
}

/// A decoded instruction with the facts the precise backend counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// Linear address.
    pub ip: u64,
    /// Length in bytes.
    pub len: u8,
    /// Branch classification.
    pub branch: BranchKind,
    /// Loads memory (MEM_INST_RETIRED.ALL_LOADS counts it once).
    pub loads: bool,
    /// Stores to memory (MEM_INST_RETIRED.ALL_STORES counts it once).
    pub stores: bool,
    /// Is RDPMC.
    pub rdpmc: bool,
    /// Is WRMSR.
    pub wrmsr: bool,
    /// Is HLT (the vCPU will park in the kernel).
    pub hlt: bool,
    /// May be a string instruction with a REP prefix (retires once, as on hardware).
    pub rep: bool,
    /// Target of a direct near branch (indirect branches: None).
    pub target: Option<u64>,
    /// Straight-line, register-only and unable to fault: may run inside a block that is not
    /// single-stepped (see `block_length`).
    pub simple: bool,
    /// First explicit memory operand's address components, if any.
    mem: Option<MemOperand>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MemOperand {
    seg: Register,
    base: Register,
    index: Register,
    scale: u32,
    displ: u64,
    ip_relative: bool,
}

impl Insn {
    /// Address of the next sequential instruction.
    pub fn fallthrough(&self) -> u64 {
        self.ip.wrapping_add(u64::from(self.len))
    }

    /// Whether the instruction was a taken branch, given where execution continued. Jumps,
    /// calls and returns are always taken, even to the next instruction (`call 1f; 1:`); only a
    /// conditional branch can fall through.
    pub fn taken(&self, next_ip: u64) -> bool {
        match self.branch {
            BranchKind::None => false,
            BranchKind::Conditional => next_ip != self.fallthrough(),
            _ => true,
        }
    }

    /// Data linear address of the first memory operand, computed from the registers *before*
    /// the instruction ran (`reg` returns a register's value; `seg_base` FS/GS bases).
    pub fn data_address(
        &self,
        reg: impl Fn(Register) -> u64,
        seg_base: impl Fn(Register) -> u64,
    ) -> Option<u64> {
        let m = self.mem?;
        let mut a = m.displ;
        if m.ip_relative {
            return Some(a);
        }
        if m.base != Register::None {
            a = a.wrapping_add(reg(m.base));
        }
        if m.index != Register::None {
            a = a.wrapping_add(reg(m.index).wrapping_mul(u64::from(m.scale)));
        }
        if matches!(m.seg, Register::FS | Register::GS) {
            a = a.wrapping_add(seg_base(m.seg));
        }
        Some(a)
    }
}

/// Decodes one 64-bit-mode instruction at `ip` from `bytes`. Returns None for bytes that do not
/// decode (the guest will take #UD; nothing retires).
pub fn decode(ip: u64, bytes: &[u8], bitness: u32) -> Option<Insn> {
    let mut d = Decoder::with_ip(bitness, bytes, ip, DecoderOptions::NONE);
    let i = d.decode();
    if i.is_invalid() {
        return None;
    }
    Some(classify(&i))
}

/// General-purpose integer instructions that, without a memory operand, cannot fault, trap or
/// change control flow or privileged state (DIV/IDIV, I/O, MSR, CPUID, control-register moves and
/// everything else stay single-stepped).
const SIMPLE: &[Mnemonic] = &[
    Mnemonic::Mov,
    Mnemonic::Movzx,
    Mnemonic::Movsx,
    Mnemonic::Movsxd,
    Mnemonic::Add,
    Mnemonic::Sub,
    Mnemonic::Adc,
    Mnemonic::Sbb,
    Mnemonic::And,
    Mnemonic::Or,
    Mnemonic::Xor,
    Mnemonic::Not,
    Mnemonic::Neg,
    Mnemonic::Inc,
    Mnemonic::Dec,
    Mnemonic::Cmp,
    Mnemonic::Test,
    Mnemonic::Lea,
    Mnemonic::Shl,
    Mnemonic::Shr,
    Mnemonic::Sar,
    Mnemonic::Rol,
    Mnemonic::Ror,
    Mnemonic::Shld,
    Mnemonic::Shrd,
    Mnemonic::Imul,
    Mnemonic::Mul,
    Mnemonic::Nop,
    Mnemonic::Xchg,
    Mnemonic::Bswap,
    Mnemonic::Bt,
    Mnemonic::Bts,
    Mnemonic::Btr,
    Mnemonic::Btc,
    Mnemonic::Cdq,
    Mnemonic::Cqo,
    Mnemonic::Cdqe,
    Mnemonic::Cwde,
    Mnemonic::Clc,
    Mnemonic::Stc,
    Mnemonic::Cmc,
    Mnemonic::Cld,
    Mnemonic::Std,
    Mnemonic::Pause,
    Mnemonic::Cmove,
    Mnemonic::Cmovne,
    Mnemonic::Cmovl,
    Mnemonic::Cmovge,
    Mnemonic::Cmovle,
    Mnemonic::Cmovg,
    Mnemonic::Cmovb,
    Mnemonic::Cmovae,
    Mnemonic::Cmovbe,
    Mnemonic::Cmova,
    Mnemonic::Sete,
    Mnemonic::Setne,
    Mnemonic::Setl,
    Mnemonic::Setge,
    Mnemonic::Setb,
    Mnemonic::Setae,
];

fn classify(i: &Instruction) -> Insn {
    let branch = match i.flow_control() {
        FlowControl::Next | FlowControl::Exception => BranchKind::None,
        FlowControl::ConditionalBranch => BranchKind::Conditional,
        FlowControl::UnconditionalBranch | FlowControl::IndirectBranch => {
            if i.is_jmp_far() || i.is_jmp_far_indirect() {
                BranchKind::Far
            } else {
                BranchKind::Jump
            }
        }
        FlowControl::Call | FlowControl::IndirectCall => {
            if i.is_call_far() || i.is_call_far_indirect() {
                BranchKind::Far
            } else {
                BranchKind::NearCall
            }
        }
        FlowControl::Return => match i.code() {
            Code::Retnq
            | Code::Retnq_imm16
            | Code::Retnd
            | Code::Retnd_imm16
            | Code::Retnw
            | Code::Retnw_imm16 => BranchKind::NearReturn,
            _ => BranchKind::Far,
        },
        FlowControl::Interrupt | FlowControl::XbeginXabortXend => BranchKind::Far,
    };
    let mut factory = InstructionInfoFactory::new();
    let info = factory.info(i);
    let mut loads = false;
    let mut stores = false;
    for m in info.used_memory() {
        // LEA and NOP-with-memory do not access memory; iced reports them as NoMemAccess.
        match m.access() {
            OpAccess::Read | OpAccess::CondRead => loads = true,
            OpAccess::Write | OpAccess::CondWrite => stores = true,
            OpAccess::ReadWrite | OpAccess::ReadCondWrite => {
                loads = true;
                stores = true;
            }
            _ => {}
        }
    }
    let simple = branch == BranchKind::None
        && !loads
        && !stores
        && !i.has_rep_prefix()
        && !i.has_repne_prefix()
        && SIMPLE.contains(&i.mnemonic())
        && (0..i.op_count()).all(|n| {
            i.op_kind(n) != OpKind::Register || {
                let r = i.op_register(n);
                !r.is_cr() && !r.is_dr() && !r.is_segment_register()
            }
        });
    let mem = info.used_memory().first().map(|m| MemOperand {
        seg: m.segment(),
        base: m.base(),
        index: m.index(),
        scale: m.scale(),
        displ: m.displacement(),
        ip_relative: m.base() == Register::RIP || m.base() == Register::EIP,
    });
    Insn {
        ip: i.ip(),
        len: u8::try_from(i.len()).unwrap_or(0),
        branch,
        loads,
        stores,
        rdpmc: i.code() == Code::Rdpmc,
        wrmsr: i.code() == Code::Wrmsr,
        hlt: i.code() == Code::Hlt,
        rep: i.has_rep_prefix() || i.has_repe_prefix() || i.has_repne_prefix(),
        target: matches!(
            i.op0_kind(),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
        )
        .then(|| i.near_branch_target()),
        simple,
        mem,
    }
}

/// The straight-line run of simple instructions starting at `ip` (at most `max`): their
/// addresses and the address of the first instruction after the run.
pub fn straight_line(ip: u64, bytes: &[u8], bitness: u32, max: usize) -> (Vec<u64>, u64) {
    let mut d = Decoder::with_ip(bitness, bytes, ip, DecoderOptions::NONE);
    let mut ips = Vec::new();
    let mut end = ip;
    while ips.len() < max && d.can_decode() {
        let i = d.decode();
        // A truncated or invalid instruction ends the run before it.
        if i.is_invalid() || !classify(&i).simple {
            break;
        }
        ips.push(i.ip());
        end = i.next_ip();
    }
    (ips, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(bytes: &[u8]) -> Insn {
        decode(0x1000, bytes, 64).unwrap()
    }

    #[test]
    fn branches() {
        assert_eq!(d(&[0x75, 0x02]).branch, BranchKind::Conditional); // jne
        assert_eq!(d(&[0xeb, 0x00]).branch, BranchKind::Jump); // jmp short
        assert_eq!(d(&[0xe8, 0, 0, 0, 0]).branch, BranchKind::NearCall);
        assert_eq!(d(&[0xff, 0xd0]).branch, BranchKind::NearCall); // call rax
        assert_eq!(d(&[0xc3]).branch, BranchKind::NearReturn);
        assert_eq!(d(&[0x48, 0xcf]).branch, BranchKind::Far); // iretq
        assert_eq!(d(&[0x90]).branch, BranchKind::None);
        let j = d(&[0x75, 0x02]);
        assert_eq!(j.target, Some(0x1004));
        assert_eq!(d(&[0xff, 0xd0]).target, None);
        assert!(j.taken(0x1004));
        assert!(!j.taken(0x1002));
        // jmp to the next instruction is still a taken branch.
        assert!(d(&[0xeb, 0x00]).taken(0x1002));
    }

    #[test]
    fn loads_stores_and_addresses() {
        let ld = d(&[0x48, 0x8b, 0x44, 0x8b, 0x10]); // mov rax, [rbx+rcx*4+0x10]
        assert!(ld.loads && !ld.stores);
        let regs = |r: Register| match r {
            Register::RBX => 0x2000,
            Register::RCX => 3,
            _ => 0,
        };
        assert_eq!(ld.data_address(regs, |_| 0), Some(0x2000 + 12 + 0x10));
        let st = d(&[0x48, 0x89, 0x03]); // mov [rbx], rax
        assert!(st.stores && !st.loads);
        let rmw = d(&[0x48, 0xff, 0x03]); // inc qword [rbx]
        assert!(rmw.loads && rmw.stores);
        let lea = d(&[0x48, 0x8d, 0x03]); // lea rax, [rbx]
        assert!(!lea.loads && !lea.stores);
        let push = d(&[0x50]); // push rax: a store
        assert!(push.stores);
        let gs = d(&[0x65, 0x48, 0x8b, 0x04, 0x25, 0x10, 0, 0, 0]); // mov rax, gs:[0x10]
        assert_eq!(
            gs.data_address(|_| 0, |s| if s == Register::GS { 0x5000 } else { 0 }),
            Some(0x5010)
        );
    }

    #[test]
    fn simple_instructions() {
        assert!(d(&[0x90]).simple); // nop
        assert!(d(&[0x48, 0x01, 0xd8]).simple); // add rax, rbx
        assert!(d(&[0x49, 0xff, 0xc8]).simple); // dec r8
        assert!(!d(&[0x48, 0x8b, 0x03]).simple); // load
        assert!(!d(&[0x48, 0xf7, 0xf1]).simple); // div rcx: may #DE
        assert!(!d(&[0x0f, 0x20, 0xd8]).simple); // mov rax, cr3
        assert!(!d(&[0x8e, 0xd8]).simple); // mov ds, ax
        assert!(!d(&[0x75, 0x02]).simple); // jne
        assert!(!d(&[0x0f, 0xa2]).simple); // cpuid
        assert!(!d(&[0x50]).simple); // push: a store
        assert!(d(&[0x48, 0x8d, 0x03]).simple); // lea rax, [rbx]: no access
    }

    #[test]
    fn straight_line_runs() {
        // nop; add rax, rbx; dec r8; jne; nop
        let code = [0x90, 0x48, 0x01, 0xd8, 0x49, 0xff, 0xc8, 0x75, 0x00, 0x90];
        assert_eq!(
            straight_line(0x1000, &code, 64, 100),
            (vec![0x1000, 0x1001, 0x1004], 0x1007)
        );
        assert_eq!(
            straight_line(0x1000, &code, 64, 2),
            (vec![0x1000, 0x1001], 0x1004)
        );
        // A run cut by the end of the readable bytes stops before the cut instruction.
        assert_eq!(
            straight_line(0x1000, &code[..3], 64, 100),
            (vec![0x1000], 0x1001)
        );
    }

    #[test]
    fn special_instructions() {
        assert!(d(&[0x0f, 0x33]).rdpmc);
        assert!(d(&[0x0f, 0x30]).wrmsr);
        assert!(d(&[0xf4]).hlt);
        assert!(d(&[0xf3, 0x48, 0xa5]).rep); // rep movsq
        assert!(decode(0, &[0x06], 64).is_none()); // push es: invalid in 64-bit mode
    }
}
