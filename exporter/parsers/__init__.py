"""Pure parsers: sysfs/procfs/kmsg text in, typed values out. No metrics here."""
