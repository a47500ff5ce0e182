//! The disks of the papers' experiments, and one of today's, as named parameter sets.
//!
//! Every number a preset uses is in its [`DiskSpec::sources`], with where it comes from: a
//! data sheet, a validated simulator model of the same drive, the paper's own text, or — where
//! nothing could be found — the assumption made and why. docs/DISKS.md prints the same
//! table for people; a test keeps every preset's parameters cited.

/// One recording zone: consecutive cylinders whose tracks hold the same number of sectors.
///
/// `track_skew` and `cylinder_skew` are how many sectors the first sector of the next track
/// (same cylinder, next head) or of the next cylinder is rotated by, so that a transfer
/// running across the boundary loses only the switch time, not a revolution. `None`: the
/// smallest skew that covers the preset's head switch (track) or single-cylinder seek
/// (cylinder), as a formatter that knows those times would lay it out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Zone {
    pub cylinders: u32,
    pub sectors_per_track: u32,
    pub track_skew: Option<u32>,
    pub cylinder_skew: Option<u32>,
}

impl Zone {
    const fn new(cylinders: u32, sectors_per_track: u32) -> Zone {
        Zone {
            cylinders,
            sectors_per_track,
            track_skew: None,
            cylinder_skew: None,
        }
    }

    const fn skewed(cylinders: u32, sectors_per_track: u32, track: u32, cylinder: u32) -> Zone {
        Zone {
            cylinders,
            sectors_per_track,
            track_skew: Some(track),
            cylinder_skew: Some(cylinder),
        }
    }
}

/// Where one parameter's value comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cite {
    /// The [`DiskSpec`] field (or fields) it sets.
    pub param: &'static str,
    pub value: &'static str,
    pub source: &'static str,
}

/// A mechanical disk: geometry, mechanics, electronics. Times in milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct DiskSpec {
    /// The name `-o disk=NAME` and `cairn bench run --device NAME` take.
    pub name: &'static str,
    /// The drive it models.
    pub model: &'static str,
    /// The paper (or purpose) it stands for.
    pub role: &'static str,
    /// Spindle speed, revolutions per minute.
    pub rpm: f64,
    /// Data surfaces (read/write heads).
    pub heads: u32,
    /// Zones from the outermost (LBA 0) inwards.
    pub zones: &'static [Zone],
    /// Seek of one cylinder, including settling.
    pub track_to_track_ms: f64,
    /// Mean seek over all pairs of cylinders (the data sheets' weighting: distance `d` of `C`
    /// cylinders weighted by `C − d`), including settling.
    pub average_seek_ms: f64,
    /// Seek across every cylinder.
    pub full_stroke_ms: f64,
    /// Switching to another head of the same cylinder.
    pub head_switch_ms: f64,
    /// Extra settling before a write after a seek (writes must be on track more exactly).
    pub write_settle_ms: f64,
    /// Controller time per command before the mechanism moves, reads and writes.
    pub read_overhead_ms: f64,
    pub write_overhead_ms: f64,
    /// Interface transfer rate, MB/s (10^6 bytes): what a hit in the drive's buffer costs.
    pub bus_mb_s: f64,
    /// Sectors the drive reads on past the end of a read into its buffer while idle;
    /// 0: no read-ahead.
    pub read_ahead_sectors: u32,
    /// Size of the write cache when it is turned on (`:wcache`), sectors. Every preset runs
    /// with it off unless told: the papers' SCSI disks acknowledged a write when it was on
    /// the platter.
    pub write_cache_sectors: u32,
    pub sources: &'static [Cite],
}

impl DiskSpec {
    /// Cylinders over every zone.
    pub fn cylinders(&self) -> u32 {
        self.zones.iter().map(|z| z.cylinders).sum()
    }

    /// 512-byte sectors over every zone.
    pub fn sectors(&self) -> u64 {
        self.zones
            .iter()
            .map(|z| {
                u64::from(z.cylinders) * u64::from(self.heads) * u64::from(z.sectors_per_track)
            })
            .sum()
    }

    /// Bytes the disk holds.
    pub fn capacity(&self) -> u64 {
        self.sectors() * super::SECTOR
    }

    /// One revolution, in seconds.
    pub fn revolution(&self) -> f64 {
        60.0 / self.rpm
    }

    /// Media rate of the outermost zone, bytes per second (no skew, no switches).
    pub fn outer_rate(&self) -> f64 {
        let spt = self.zones.first().map_or(0, |z| z.sectors_per_track);
        f64::from(spt) * super::SECTOR as f64 / self.revolution()
    }
}

/// Every preset, in the order `cairn bench` lists them.
pub fn presets() -> &'static [DiskSpec] {
    &PRESETS
}

/// The preset called `name`.
pub fn by_name(name: &str) -> Option<&'static DiskSpec> {
    PRESETS.iter().find(|p| p.name == name)
}

const DISKSIM: &str = "DiskSim 4 validated model SEAGATE_ST39102LW (extracted from the drive by DIXtrac): westerndigitalcorporation/DiskSim, STABLE/DiskSim_Linux_Generic_2.01.016/valid/cheetah9LP.model";

static PRESETS: [DiskSpec; 4] = [
    DiskSpec {
        name: "cheetah-10k",
        model: "Seagate Cheetah 9LP (ST39102LW), 9.1 GB, 10,000 RPM, Ultra2 SCSI",
        role: "000/001 Table 1: '3 9 GB 10,000 RPM Seagate Cheetahs' (test partition on disk 2, the -2 systems' log on disk 3)",
        rpm: 10_045.0,
        heads: 12,
        // (cylinders, sectors per track, track skew, cylinder skew), outermost first; the
        // model's one spare cylinder between zones folded into the zone before it.
        zones: &[
            Zone::skewed(848, 254, 97, 133),
            Zone::skewed(797, 245, 97, 133),
            Zone::skewed(749, 238, 97, 117),
            Zone::skewed(704, 227, 97, 116),
            Zone::skewed(661, 217, 97, 108),
            Zone::skewed(622, 209, 97, 108),
            Zone::skewed(585, 201, 97, 108),
            Zone::skewed(550, 189, 88, 94),
            Zone::skewed(516, 181, 88, 93),
            Zone::skewed(486, 174, 88, 93),
            Zone::skewed(444, 167, 88, 80),
        ],
        track_to_track_ms: 0.831,
        average_seek_ms: 5.47,
        full_stroke_ms: 10.627,
        head_switch_ms: 0.030,
        write_settle_ms: 0.461,
        read_overhead_ms: 0.284,
        write_overhead_ms: 0.896,
        bus_mb_s: 40.0,
        read_ahead_sectors: 561,
        write_cache_sectors: 1683,
        sources: &[
            Cite {
                param: "rpm",
                value: "10,045",
                source: DISKSIM,
            },
            Cite {
                param: "heads, zones (cylinders, sectors per track, skews)",
                value: "12 surfaces; 6,962 cylinders in 11 zones of 254 down to 167 sectors per track; skews 97/133 down to 88/80 sectors",
                source: DISKSIM,
            },
            Cite {
                param: "track_to_track_ms",
                value: "0.831",
                source: DISKSIM,
            },
            Cite {
                param: "full_stroke_ms",
                value: "10.627",
                source: DISKSIM,
            },
            Cite {
                param: "average_seek_ms",
                value: "5.47",
                source: "the mean, under the data sheets' weighting (distance d of C cylinders weighted by C − d), of the measured seek curve of the same drive: westerndigitalcorporation/DiskSim, EXPERIMENTAL/Linux_64bit_LBA_20130807_Generic/valid/cheetah9LP.seek; Seagate's product manual for the family (publication 83329240, Rev. C, Aug. 1998) is stored but not its performance section",
            },
            Cite {
                param: "head_switch_ms",
                value: "0.030",
                source: DISKSIM,
            },
            Cite {
                param: "write_settle_ms",
                value: "0.461",
                source: DISKSIM,
            },
            Cite {
                param: "read_overhead_ms, write_overhead_ms",
                value: "0.284, 0.896",
                source: "DiskSim model: 'Read miss over. after read', 'Write miss over. after write' (cheetah9LP.diskspecs)",
            },
            Cite {
                param: "read_ahead_sectors, write_cache_sectors",
                value: "561; 3 × 561",
                source: "DiskSim model: 3 buffer segments of 561 blocks, read-ahead up to a segment (cheetah9LP.diskspecs)",
            },
            Cite {
                param: "bus_mb_s",
                value: "40",
                source: "000 Table 1: Adaptec AHA-2940UW, an Ultra Wide SCSI adapter (40 MB/s)",
            },
            Cite {
                param: "capacity (check)",
                value: "17,930,568 sectors",
                source: "DiskSim model's block count is 17,783,240 (spares taken out); 000 Table 1's 9,088 MB test partition fits",
            },
        ],
    },
    DiskSpec {
        name: "viking",
        model: "Quantum Viking, 4.5 GB, 7,200 RPM, Fast SCSI",
        role: "002, 'Experimental setup': 4.5 GB Quantum Viking disks, Fast SCSI, 7,200 RPM, 8.0 ms average seek for reads",
        rpm: 7_200.0,
        heads: 8,
        zones: &[
            Zone::new(1_200, 180),
            Zone::new(1_200, 168),
            Zone::new(1_200, 156),
            Zone::new(1_200, 144),
            Zone::new(1_200, 132),
            Zone::new(1_200, 120),
        ],
        track_to_track_ms: 1.0,
        average_seek_ms: 8.0,
        full_stroke_ms: 16.0,
        head_switch_ms: 1.0,
        write_settle_ms: 0.5,
        read_overhead_ms: 0.5,
        write_overhead_ms: 0.5,
        bus_mb_s: 10.0,
        read_ahead_sectors: 256,
        write_cache_sectors: 1024,
        sources: &[
            Cite {
                param: "rpm",
                value: "7,200",
                source: "002, 'Experimental setup' (the published TOCS text; the copy in /work/shared/papers has its digits stripped: 'gb quantum viking disk drives fast scsi rpm ms average seek reads')",
            },
            Cite {
                param: "average_seek_ms",
                value: "8.0",
                source: "002, 'Experimental setup', as rpm",
            },
            Cite {
                param: "capacity",
                value: "4.5 GB",
                source: "002, 'Experimental setup', as rpm",
            },
            Cite {
                param: "bus_mb_s",
                value: "10",
                source: "002, 'Experimental setup': Fast SCSI (8-bit, 10 MB/s)",
            },
            Cite {
                param: "heads, zones",
                value: "8 heads, 7,200 cylinders, 180 down to 120 sectors per track",
                source: "not found (no Viking data sheet among the stored pages): assumed, sized to 4.5 GB with an outer-zone media rate of 11 MB/s, typical of 1997's 7,200 RPM drives",
            },
            Cite {
                param: "track_to_track_ms, full_stroke_ms",
                value: "1.0, 16.0",
                source: "not found: assumed; full stroke twice the average, the Cheetah 9LP's measured ratio (10.6 / 5.5)",
            },
            Cite {
                param: "head_switch_ms, write_settle_ms",
                value: "1.0, 0.5",
                source: "not found: assumed",
            },
            Cite {
                param: "read_overhead_ms, write_overhead_ms",
                value: "0.5",
                source: "not found: assumed, between the Cheetah's measured 0.28 and 0.90",
            },
            Cite {
                param: "read_ahead_sectors, write_cache_sectors",
                value: "256, 1,024",
                source: "not found: assumed (a 512 KB buffer)",
            },
        ],
    },
    DiskSpec {
        name: "wren-iv",
        model: "CDC/Imprimis Wren IV (94171-344), 300 MB, 3,600 RPM, SCSI",
        role: "004 §5.1: 'a Wren IV disk (1.3 MBytes/sec maximum transfer bandwidth, 17.5 milliseconds average seek time)', about 300 MB of file system",
        rpm: 3_600.0,
        heads: 9,
        zones: &[Zone::new(1_545, 46)],
        track_to_track_ms: 3.5,
        average_seek_ms: 17.5,
        full_stroke_ms: 35.0,
        head_switch_ms: 0.5,
        write_settle_ms: 0.0,
        read_overhead_ms: 1.0,
        write_overhead_ms: 1.0,
        bus_mb_s: 4.0,
        read_ahead_sectors: 0,
        write_cache_sectors: 0,
        sources: &[
            Cite {
                param: "rpm, heads, zones",
                value: "3,600 RPM; 9 heads; 1,545 data cylinders of 46 sectors per track (1,549 physical)",
                source: "SunOS/Linux Sun disk-label table, entry 'CDC Wren IV 94171-344': mirror/busybox util-linux/fdisk_sun.c (`sun_drives`); the same geometry is SUN0327's",
            },
            Cite {
                param: "media rate (check)",
                value: "46 × 512 B × 60/s = 1.41 MB/s",
                source: "004 §5.1: '1.3 MBytes/sec maximum transfer bandwidth'",
            },
            Cite {
                param: "average_seek_ms",
                value: "17.5",
                source: "004 §5.1",
            },
            Cite {
                param: "track_to_track_ms",
                value: "3.5",
                source: "not found: assumed — the Wren II (28/5.0 ms) and Wren VI (15.5/3.0 ms) data sheets' ratio of track-to-track to average seek, 0.18–0.19, times 17.5 ms (bk0010.narod.ru DRIVESPECS/IMPRIMIS 1788, 1847)",
            },
            Cite {
                param: "full_stroke_ms",
                value: "35",
                source: "not found: assumed, twice the average (the Cheetah 9LP's measured ratio)",
            },
            Cite {
                param: "head_switch_ms, write_settle_ms",
                value: "0.5, 0",
                source: "not found: assumed",
            },
            Cite {
                param: "read_overhead_ms, write_overhead_ms",
                value: "1.0",
                source: "not found: assumed (an SCSI-1 controller of 1988)",
            },
            Cite {
                param: "bus_mb_s",
                value: "4",
                source: "not found: assumed (synchronous SCSI-1); only buffer hits use it, and this preset has no read-ahead",
            },
            Cite {
                param: "read_ahead_sectors, write_cache_sectors",
                value: "0, 0",
                source: "assumed: no drive cache (SunOS 4's FFS did its own read-ahead); 004 does not say",
            },
        ],
    },
    DiskSpec {
        name: "hdd-7200",
        model: "a present-day 4 TB 7,200 RPM drive (Ultrastar 7K4000 class)",
        role: "today's mechanical disk, beside the papers' and this machine's device",
        rpm: 7_200.0,
        heads: 10,
        zones: &[
            Zone::new(40_000, 3_200),
            Zone::new(40_000, 3_000),
            Zone::new(40_000, 2_800),
            Zone::new(40_000, 2_600),
            Zone::new(40_000, 2_400),
            Zone::new(40_000, 2_200),
            Zone::new(40_000, 1_950),
            Zone::new(40_000, 1_700),
        ],
        track_to_track_ms: 1.0,
        average_seek_ms: 8.2,
        full_stroke_ms: 20.0,
        head_switch_ms: 1.0,
        write_settle_ms: 0.5,
        read_overhead_ms: 0.1,
        write_overhead_ms: 0.1,
        bus_mb_s: 600.0,
        read_ahead_sectors: 2_048,
        write_cache_sectors: 65_536,
        sources: &[
            Cite {
                param: "rpm",
                value: "7,200",
                source: "HGST Ultrastar 7K4000 (SAS) specification §4.4 (easymanua.ls/hgst/hus724040als640, p. 25)",
            },
            Cite {
                param: "average_seek_ms",
                value: "8.2 (read, typical)",
                source: "HGST Ultrastar 7K4000 specification, Table 6, as rpm",
            },
            Cite {
                param: "track_to_track_ms, full_stroke_ms",
                value: "1.0, 20.0 (read, typical)",
                source: "Hitachi 7,200 RPM OEM specification (7K320, manualowl.com/m/Hitachi/7K320 p. 19, Tables 6–7): the 7K4000 page stored gives only the average",
            },
            Cite {
                param: "heads, zones",
                value: "10 heads, 320,000 cylinders, 3,200 down to 1,700 sectors per track",
                source: "not found: assumed — 4 TB, 196 MB/s outer and 104 MB/s inner media rate, typical of current 7,200 RPM drives (the Exos 7E10 product manual, publication 200440800, is stored but not its rate table)",
            },
            Cite {
                param: "head_switch_ms, write_settle_ms",
                value: "1.0, 0.5",
                source: "not found: assumed",
            },
            Cite {
                param: "read_overhead_ms, write_overhead_ms",
                value: "0.1",
                source: "not found: assumed",
            },
            Cite {
                param: "bus_mb_s",
                value: "600",
                source: "SATA 6 Gb/s",
            },
            Cite {
                param: "read_ahead_sectors, write_cache_sectors",
                value: "2,048, 65,536",
                source: "assumed (1 MiB read-ahead, 32 MiB of a 64–128 MB buffer for writes); the drive ships with its write cache on, the model keeps it off unless told (`:wcache`) so that every preset makes the papers' promise",
            },
        ],
    },
];
