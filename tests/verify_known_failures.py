"""Where verify.py knowingly disagrees with ../shared/data/verifier_cases.jsonl, and why.

tests/test_verify_cases.py enforces this list both ways: a disagreement that is not listed fails,
and so does a listed case that starts to agree (then delete it here). Keys are 0-based line numbers
of verifier_cases.jsonl; each entry also holds the start of the case's `pred`, which the test
checks, so an edited data file cannot silently re-point an entry.

KNOWN_FAILURES: cases without a REVIEW note where our answer differs from `expected` (they count
against the >= 95%). REVIEW_VERDICTS: the 6 REVIEW cases (excluded from agreement by the data
README): the verdict we give and why.
"""

KNOWN_FAILURES = {
    28: ("Answer $ \n 9 \n $",
         "Math-Verify latex-only config: an inline $...$ may not span lines and there is no number "
         "fallback, so upstream finds nothing; we always fall back to the rightmost number (9)."),
    29: ("Answer \\( \n 9 \n \\)",
         "Same as line 28 with \\( ... \\)."),
    180: ("$-2 \\\\le x \\\\le 7$",
          "Config-dependent pair with line 179 (same pred and gold, expected True): "
          "with allow_set_relation_comp=False Math-Verify will not compare a chained inequality "
          "with an interval; we always do (179's setting)."),
    191: ("$z \\in \\left[-\\frac{3}{2}, -1\\right]",
          "'1 <= |z| <= 3/2' is the union [-3/2, -1] u [1, 3/2]; we only turn 'a <= x <= b' with a "
          "bare name x into an interval and do not solve inequalities in |z|."),
    245: ("$f(y)$",
          "Config-dependent pair with line 244 (expected False): only Math-Verify's strict=False "
          "lets f(y) equal f(x) by renaming the variable; we compare as written "
          "(244's strict=True)."),
    302: ("4, 10, -2",
          "hendrycks/math compares normalised strings, so a reordered list differs; we compare "
          "bare lists as sets (Math-Verify agrees with us)."),
    309: ("4, .1, 2",
          "Same policy as line 302 ('4, .1, 2' vs '0.1, 4, 2')."),
    363: ("\\left(2,1\\right)",
          "dart-math treats (2,1) and (1,2) as equal; we keep tuples ordered because an ordered "
          "pair is a point (Math-Verify agrees with us)."),
    384: ("Correct answer \\frac{63}{400} but",
          "TRL's reasoning_accuracy_reward gives 0 when no </think> closes the reasoning; we grade "
          "the answer whatever the format (Math-Verify agrees with us)."),
}

REVIEW_VERDICTS = {
    94: ("$x = 5+5+1 = 7 =11$", True,
         "a predicted chain reduces to its last side (11), the README's stated upstream policy"),
    104: ("$0$", False,
          "a gold chain '1 = \\zzz = x = 0' stays an equation: we reduce chains only on the "
          "prediction side"),
    109: ("$z = 3+3 = 2$", False,
          "the gold chain 'z = 1 + 1 = 2' stays an equation (see line 104); the prediction's "
          "'3+3 = 2' is false anyway"),
    255: ("$1 + \\frac{1}{\\mathrm{e}}$", False,
          "1 + 1/e and 1 - 1/e are different numbers; upstream's True is wrong"),
    311: ("10", True,
          "a trailing % is dropped (hendrycks strip_string, NeMo), so 10% == 10"),
    349: ("0.0304", False,
          "no x100 percent rescaling: 0.0304 is not 3.04"),
}
