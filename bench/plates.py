"""Writes N Indonesian-style licence plates as a `holdfast import` CSV:
region code, number and suffix letters (`B1234XYZ`, `AB12CD`), each once,
with a price in rupiah (minor units: sen) and attributes to filter on:
`region` (string), `digits` (integer), `premium` (boolean: a short or
repeating number).

    python3 bench/plates.py 2000000 > plates.csv
"""

from __future__ import annotations

import csv
import itertools
import string
import sys

REGIONS = ["A", "AA", "AB", "AD", "AE", "AG", "B", "BA", "BB", "BD", "BE", "BG", "BH", "BK",
           "BL", "BM", "BN", "BP", "D", "DA", "DB", "DD", "DE", "DG", "DH", "DK", "DL", "DM",
           "DN", "DR", "DT", "E", "EA", "EB", "ED", "F", "G", "H", "K", "KB", "KH", "KT", "KU",
           "L", "M", "N", "P", "PA", "R", "S", "T", "W", "Z"]
SUFFIXES = ["".join(p) for n in (1, 2, 3) for p in itertools.product(string.ascii_uppercase,
                                                                      repeat=n)]


def plates(count: int):
    """(id, region, number) for the first `count` plates, in an order that
    spreads regions and numbers as a real catalogue does."""
    made = 0
    for suffix in SUFFIXES:
        for number in range(1, 10000):
            for region in REGIONS:
                if made == count:
                    return
                yield f"{region}{number}{suffix}", region, number
                made += 1


def premium(number: int) -> bool:
    digits = str(number)
    return len(digits) <= 2 or len(set(digits)) == 1


def main() -> int:
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit(__doc__)
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["id", "name", "price_amount", "price_currency", "attr.region", "attr.digits",
                  "attr.premium"])
    for plate, region, number in plates(int(sys.argv[1])):
        special = premium(number)
        # Rp 1,500,000 for an ordinary plate, from Rp 25,000,000 for a premium one.
        rupiah = 25_000_000 + 1_000_000 * (number % 50) if special else 1_500_000
        out.writerow([plate, f"Plate {region} {number} {plate[len(region) + len(str(number)):]}",
                      rupiah * 100, "IDR", region, len(str(number)),
                      "true" if special else "false"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
