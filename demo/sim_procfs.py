"""The simulated /proc of one GPU node: net/snmp, net/netstat, net/route, net/dev, boot_id.

Formats are the kernel's own (Debian 12, Linux 6.1): header/value line pairs for snmp and
netstat, the fixed-width 127-column rows of net/route, the printf layout of net/dev.
The TCP model is a busy control plane (checkpoint, storage and launcher traffic) with a
retransmit rate around 0.05%; a microburst fault raises retransmits and timeouts.
"""
from __future__ import annotations

import random
import uuid

from .sim_files import TreeWriter
from .sim_sysfs import NetDevice, occasional

SNMP_IP = ("Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos InDiscards "
           "InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout ReasmReqds ReasmOKs ReasmFails FragOKs "
           "FragFails FragCreates").split()
SNMP_ICMP = ("InMsgs InErrors InCsumErrors InDestUnreachs InTimeExcds InParmProbs InSrcQuenchs InRedirects InEchos "
             "InEchoReps InTimestamps InTimestampReps InAddrMasks InAddrMaskReps OutMsgs OutErrors "
             "OutDestUnreachs OutTimeExcds OutParmProbs OutSrcQuenchs OutRedirects OutEchos OutEchoReps "
             "OutTimestamps OutTimestampReps OutAddrMasks OutAddrMaskReps").split()
SNMP_TCP = ("RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab "
            "InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors").split()
SNMP_UDP = "InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors".split()
TCP_EXT = (
    "SyncookiesSent SyncookiesRecv SyncookiesFailed EmbryonicRsts PruneCalled RcvPruned OfoPruned OutOfWindowIcmps "
    "LockDroppedIcmps ArpFilter TW TWRecycled TWKilled PAWSActive PAWSEstab DelayedACKs DelayedACKLocked "
    "DelayedACKLost ListenOverflows ListenDrops TCPHPHits TCPPureAcks TCPHPAcks TCPRenoRecovery TCPSackRecovery "
    "TCPSACKReneging TCPSACKReorder TCPRenoReorder TCPTSReorder TCPFullUndo TCPPartialUndo TCPDSACKUndo TCPLossUndo "
    "TCPLostRetransmit TCPRenoFailures TCPSackFailures TCPLossFailures TCPFastRetrans TCPSlowStartRetrans "
    "TCPTimeouts TCPLossProbes TCPLossProbeRecovery TCPRenoRecoveryFail TCPSackRecoveryFail TCPRcvCollapsed "
    "TCPDSACKOldSent TCPDSACKOfoSent TCPDSACKRecv TCPDSACKOfoRecv TCPAbortOnData TCPAbortOnClose "
    "TCPAbortOnMemory TCPAbortOnTimeout TCPAbortOnLinger TCPAbortFailed TCPMemoryPressures "
    "TCPMemoryPressuresChrono TCPSACKDiscard TCPDSACKIgnoredOld TCPDSACKIgnoredNoUndo TCPSpuriousRTOs "
    "TCPMD5NotFound TCPMD5Unexpected TCPMD5Failure TCPSackShifted TCPSackMerged TCPSackShiftFallback "
    "TCPBacklogCoalesce TCPBacklogDrop PFMemallocDrop TCPMinTTLDrop TCPDeferAcceptDrop IPReversePathFilter "
    "TCPTimeWaitOverflow TCPReqQFullDoCookies TCPReqQFullDrop TCPRetransFail TCPRcvCoalesce TCPOFOQueue "
    "TCPOFODrop TCPOFOMerge TCPChallengeACK TCPSYNChallenge TCPFastOpenActive TCPFastOpenActiveFail "
    "TCPFastOpenPassive TCPFastOpenPassiveFail TCPFastOpenListenOverflow TCPFastOpenCookieReqd "
    "TCPFastOpenBlackhole TCPSpuriousRtxHostQueues BusyPollRxPackets TCPAutoCorking TCPFromZeroWindowAdv "
    "TCPToZeroWindowAdv TCPWantZeroWindowAdv TCPSynRetrans TCPOrigDataSent TCPHystartTrainDetect "
    "TCPHystartTrainCwnd TCPHystartDelayDetect TCPHystartDelayCwnd TCPACKSkippedSynRecv TCPACKSkippedPAWS "
    "TCPACKSkippedSeq TCPACKSkippedFinWait2 TCPACKSkippedTimeWait TCPACKSkippedChallenge TCPWinProbe "
    "TCPKeepAlive TCPMTUPFail TCPMTUPSuccess TCPDelivered TCPDeliveredCE TCPAckCompressed TCPZeroWindowDrop "
    "TCPRcvQDrop TCPWqueueTooBig TCPFastOpenPassiveAltKey TcpTimeoutRehash TcpDuplicateDataRehash "
    "TCPDSACKRecvSegs TCPDSACKIgnoredDubious TCPMigrateReqSuccess TCPMigrateReqFailure TCPPLBRehash").split()
IP_EXT = ("InNoRoutes InTruncatedPkts InMcastPkts OutMcastPkts InBcastPkts OutBcastPkts InOctets OutOctets "
          "InMcastOctets OutMcastOctets InBcastOctets OutBcastOctets InCsumErrors InNoECTPkts InECT1Pkts "
          "InECT0Pkts InCEPkts ReasmOverlaps").split()

# Healthy per-second rates of the TCP counters this model moves.
SEGMENTS_PER_SECOND = 30000.0
HEALTHY_RETRANS_FRACTION = 0.0005
HEALTHY_TIMEOUTS_PER_SECOND = 0.02
MICROBURST_RETRANS_FRACTION = 0.04
MICROBURST_TIMEOUTS_PER_SECOND = 20.0


class SimProcfs:
    def __init__(self, writer: TreeWriter, node_index: int, rng: random.Random, uptime: float) -> None:
        self.w = writer
        self.rng = rng
        self.node_index = node_index
        self.boot_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        self.tcp = dict.fromkeys(SNMP_TCP, 0)
        self.tcp.update(RtoAlgorithm=1, RtoMin=200, RtoMax=120000, MaxConn=-1)
        self.tcp_ext = dict.fromkeys(TCP_EXT, 0)
        self.ip = dict.fromkeys(SNMP_IP, 0)
        self.ip.update(Forwarding=2, DefaultTTL=64)
        self.udp = dict.fromkeys(SNMP_UDP, 0)
        self.ip_ext = dict.fromkeys(IP_EXT, 0)
        self.established = rng.randint(140, 180)
        self.advance(uptime * rng.uniform(0.6, 0.9), None)

    def advance(self, dt: float, microburst: dict | None) -> None:
        """dt seconds of TCP activity; `microburst` (fault params) when one is active."""
        rng, tcp, ext = self.rng, self.tcp, self.tcp_ext
        out_segs = int(SEGMENTS_PER_SECOND * dt * rng.uniform(0.8, 1.2))
        in_segs = int(out_segs * rng.uniform(0.95, 1.05))
        fraction, timeouts = HEALTHY_RETRANS_FRACTION, HEALTHY_TIMEOUTS_PER_SECOND
        if microburst is not None:
            fraction = float(microburst.get("retrans_fraction", MICROBURST_RETRANS_FRACTION))
            timeouts = float(microburst.get("timeouts_per_second", MICROBURST_TIMEOUTS_PER_SECOND))
        retrans = int(out_segs * fraction * rng.uniform(0.7, 1.3))
        timeout_count = occasional(rng, timeouts * rng.uniform(0.7, 1.3), dt)
        tcp["OutSegs"] += out_segs + retrans
        tcp["InSegs"] += in_segs
        tcp["RetransSegs"] += retrans
        tcp["ActiveOpens"] += occasional(rng, 2.0, dt)
        tcp["PassiveOpens"] += occasional(rng, 2.5, dt)
        tcp["AttemptFails"] += occasional(rng, 0.01, dt)
        tcp["EstabResets"] += occasional(rng, 0.05, dt)
        tcp["OutRsts"] += occasional(rng, 0.3, dt)
        ext["TCPTimeouts"] += timeout_count
        ext["TCPFastRetrans"] += max(0, retrans - timeout_count)
        ext["TCPLossProbes"] += occasional(rng, 0.5 + timeouts, dt)
        ext["TCPLostRetransmit"] += occasional(rng, timeouts / 10, dt)
        ext["TCPSynRetrans"] += occasional(rng, 0.01 + (timeouts / 20 if microburst else 0), dt)
        ext["TCPSpuriousRTOs"] += occasional(rng, timeouts / 50, dt)
        ext["DelayedACKs"] += int(in_segs * 0.02)
        ext["TCPHPHits"] += int(in_segs * 0.6)
        ext["TCPPureAcks"] += int(in_segs * 0.3)
        ext["TCPHPAcks"] += int(in_segs * 0.25)
        ext["TCPOrigDataSent"] += out_segs
        ext["TCPDelivered"] += out_segs
        ext["TCPRcvCoalesce"] += int(in_segs * 0.1)
        ext["TCPAutoCorking"] += int(out_segs * 0.01)
        ext["TCPKeepAlive"] += occasional(rng, 1.0, dt)
        ext["TW"] += occasional(rng, 2.0, dt)
        self.established = max(100, min(220, self.established + rng.choice((-1, 0, 0, 1))))
        tcp["CurrEstab"] = self.established
        datagrams = int(200 * dt * rng.uniform(0.8, 1.2))
        self.udp["InDatagrams"] += datagrams
        self.udp["OutDatagrams"] += datagrams
        self.ip["InReceives"] += in_segs + datagrams
        self.ip["InDelivers"] += in_segs + datagrams
        self.ip["OutRequests"] += out_segs + retrans + datagrams
        self.ip_ext["InOctets"] += (in_segs + datagrams) * 900
        self.ip_ext["OutOctets"] += (out_segs + retrans + datagrams) * 900
        self.ip_ext["InNoECTPkts"] += in_segs + datagrams

    # ---- files ---------------------------------------------------------------------------
    def write_static(self) -> None:
        self.w.write("proc/sys/kernel/random/boot_id", self.boot_id + "\n")
        self.w.write("proc/net/route", self._route())

    def write_dynamic(self, netdevs: dict[str, NetDevice]) -> None:
        self.w.write("proc/net/snmp", self._snmp())
        self.w.write("proc/net/netstat", _pairs("TcpExt", TCP_EXT, self.tcp_ext) + _pairs("IpExt", IP_EXT, self.ip_ext))
        self.w.write("proc/net/dev", _net_dev(netdevs))

    def _snmp(self) -> str:
        icmp = dict.fromkeys(SNMP_ICMP, 0)
        return (_pairs("Ip", SNMP_IP, self.ip) + _pairs("Icmp", SNMP_ICMP, icmp)
                + "IcmpMsg: InType3 OutType3\nIcmpMsg: 0 0\n"
                + _pairs("Tcp", SNMP_TCP, self.tcp) + _pairs("Udp", SNMP_UDP, self.udp)
                + _pairs("UdpLite", SNMP_UDP, dict.fromkeys(SNMP_UDP, 0)))

    def _route(self) -> str:
        # Management network 10.<16+node>.0.0/16 with the default route via eth0; the storage
        # fabric 172.16.0.0/16 on eth1 with no gateway. Addresses are little-endian hex.
        def hexaddr(a: int, b: int, c: int, d: int) -> str:
            return f"{d:02X}{c:02X}{b:02X}{a:02X}"

        mgmt_net = hexaddr(10, 16 + self.node_index % 200, 0, 0)
        rows = [
            ("eth0", "00000000", hexaddr(10, 16 + self.node_index % 200, 0, 1), 0x0003, 100, "00000000"),
            ("eth0", mgmt_net, "00000000", 0x0001, 100, hexaddr(255, 255, 0, 0)),
            ("eth1", hexaddr(172, 16, 0, 0), "00000000", 0x0001, 0, hexaddr(255, 255, 0, 0)),
        ]
        header = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"
        lines = [header.ljust(127)]
        for iface, dest, gateway, flags, metric, mask in rows:
            lines.append(f"{iface}\t{dest}\t{gateway}\t{flags:04X}\t0\t0\t{metric}\t{mask}\t0\t0\t0".ljust(127))
        return "\n".join(lines) + "\n"


def _pairs(prefix: str, names: list[str], values: dict[str, int]) -> str:
    return f"{prefix}: {' '.join(names)}\n{prefix}: {' '.join(str(values[n]) for n in names)}\n"


def _net_dev(netdevs: dict[str, NetDevice]) -> str:
    out = ["Inter-|   Receive                                                |  Transmit\n",
           " face |bytes    packets errs drop fifo frame compressed multicast|"
           "bytes    packets errs drop fifo colls carrier compressed\n"]
    for dev in netdevs.values():
        s = dev.stats
        frame = s["rx_length_errors"] + s["rx_over_errors"] + s["rx_crc_errors"] + s["rx_frame_errors"]
        carrier = s["tx_carrier_errors"] + s["tx_aborted_errors"] + s["tx_window_errors"] + s["tx_heartbeat_errors"]
        out.append(f"{dev.name:>6}: {s['rx_bytes']:7d} {s['rx_packets']:7d} {s['rx_errors']:4d} "
                   f"{s['rx_dropped'] + s['rx_missed_errors']:4d} {s['rx_fifo_errors']:4d} {frame:5d} "
                   f"{s['rx_compressed']:10d} {s['multicast']:9d} {s['tx_bytes']:8d} {s['tx_packets']:7d} "
                   f"{s['tx_errors']:4d} {s['tx_dropped']:4d} {s['tx_fifo_errors']:4d} {s['collisions']:5d} "
                   f"{carrier:7d} {s['tx_compressed']:10d}\n")
    return "".join(out)
