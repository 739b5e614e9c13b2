//! The Python literals a `.npy` header dict is written in, parsed as `ast.literal_eval`
//! parses them: NumPy reads a header with `literal_eval`, so a parser
//! that matched keys by text search took the first of duplicate keys where NumPy takes
//! the last, and accepted headers NumPy refuses.
//!
//! Covered: dicts, tuples (`(6)` is an int, `(6,)` a tuple), lists and sets (parsed so
//! that they can be refused by type), strings in single or double quotes with escapes and
//! the `u`/`r` prefixes (every escape Python reads; `\N{...}` for printable ASCII),
//! adjacent strings joined, integers (decimal, `0x`/`0o`/`0b`, underscores, one unary sign
//! before a number, as `literal_eval` takes), floats (read so that they can be refused by
//! type), `True`/`False`/`None`, comments and any whitespace between tokens. Anything else
//! (bytes, triple quotes, expressions) is refused: NumPy refuses it too, or a header never
//! holds it.

/// A parsed literal.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Lit {
    /// A string.
    Str(String),
    /// An integer (wide enough for any extent and its sign).
    Int(i128),
    /// `True` or `False`.
    Bool(bool),
    /// `None`.
    None,
    /// A tuple.
    Tuple(Vec<Lit>),
    /// A list or a set: never valid in a header, kept to say so.
    Other(&'static str),
    /// A dict, in source order (later duplicates win when read with [`Lit::get`]).
    Dict(Vec<(Lit, Lit)>),
}

impl Lit {
    /// The value of string key `key` in a dict: the last one, as Python's dict keeps.
    pub(crate) fn get(&self, key: &str) -> Option<&Lit> {
        match self {
            Lit::Dict(items) => items
                .iter()
                .rev()
                .find(|(k, _)| matches!(k, Lit::Str(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The distinct keys of a dict, as Python would hold them (strings only, else `None`).
    pub(crate) fn str_keys(&self) -> Option<Vec<&str>> {
        let Lit::Dict(items) = self else { return None };
        let mut keys: Vec<&str> = Vec::new();
        for (k, _) in items {
            let Lit::Str(s) = k else { return None };
            if !keys.contains(&s.as_str()) {
                keys.push(s);
            }
        }
        Some(keys)
    }
}

/// Parses `text` as one literal (leading and trailing whitespace and comments allowed).
/// `long_suffix`: integers may end in Python 2's `L` (NumPy's second try for version 1
/// and 2 headers, `_filter_header`).
pub(crate) fn parse(text: &str, long_suffix: bool) -> Result<Lit, String> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
        depth: 0,
        long_suffix,
        signed: false,
    };
    let v = p.value()?;
    p.skip();
    if p.i != p.s.len() {
        return Err(format!("unexpected text at byte {}", p.i));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    depth: usize,
    long_suffix: bool,
    /// Whether the value just parsed was a signed number (`literal_eval` takes one sign
    /// before a number, never before a signed one: `--6` and `-(-6)` are refused).
    signed: bool,
}

/// Deepest nesting accepted (a header has two levels; this bounds recursion).
const MAX_DEPTH: usize = 64;

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    /// Skips whitespace, comments and line continuations. Inside brackets newlines are
    /// whitespace too, and a header is one bracketed expression.
    fn skip(&mut self) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' => self.i += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.i += 1;
                    }
                }
                b'\\' if self.s.get(self.i + 1) == Some(&b'\n') => self.i += 2,
                _ => break,
            }
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.skip();
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Result<Lit, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err("nested too deeply".into());
        }
        let v = self.value_inner();
        self.depth -= 1;
        v
    }

    fn value_inner(&mut self) -> Result<Lit, String> {
        self.signed = false;
        self.skip();
        let Some(c) = self.peek() else {
            return Err("unexpected end".into());
        };
        match c {
            b'{' => {
                self.i += 1;
                self.braces()
            }
            b'(' => {
                self.i += 1;
                let (items, trailing) = self.items(b')')?;
                Ok(if items.len() == 1 && !trailing {
                    items.into_iter().next().unwrap_or(Lit::None)
                } else {
                    Lit::Tuple(items)
                })
            }
            b'[' => {
                self.i += 1;
                self.items(b']')?;
                Ok(Lit::Other("list"))
            }
            b'\'' | b'"' => self.strings(),
            b'u' | b'U' | b'r' | b'R' if matches!(self.s.get(self.i + 1), Some(b'\'' | b'"')) => {
                self.strings()
            }
            b'+' | b'-' => {
                self.i += 1;
                let v = self.value()?;
                match v {
                    // A number, not a bool (True is a Constant, but literal_eval signs only
                    // int, float and complex ones) and not a signed number.
                    Lit::Int(n) if !self.signed => {
                        self.signed = true;
                        Ok(Lit::Int(if c == b'-' { -n } else { n }))
                    }
                    f @ Lit::Other("float") if !self.signed => {
                        self.signed = true;
                        Ok(f)
                    }
                    _ => Err("a sign before something that is not a number".into()),
                }
            }
            b'0'..=b'9' => self.int(),
            b'.' if self.s.get(self.i + 1).is_some_and(u8::is_ascii_digit) => self.int(),
            _ => {
                let start = self.i;
                while self
                    .peek()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
                {
                    self.i += 1;
                }
                match &self.s[start..self.i] {
                    b"True" => Ok(Lit::Bool(true)),
                    b"False" => Ok(Lit::Bool(false)),
                    b"None" => Ok(Lit::None),
                    _ => Err(format!("unexpected text at byte {start}")),
                }
            }
        }
    }

    /// Comma-separated values up to `close`; whether a trailing comma ended them.
    fn items(&mut self, close: u8) -> Result<(Vec<Lit>, bool), String> {
        let mut items = Vec::new();
        loop {
            if self.eat(close) {
                return Ok((items, true));
            }
            items.push(self.value()?);
            if self.eat(close) {
                return Ok((items, false));
            }
            if !self.eat(b',') {
                return Err(format!("expected ',' at byte {}", self.i));
            }
        }
    }

    /// After `{`: a dict, or a set (refused later), or `{}`.
    fn braces(&mut self) -> Result<Lit, String> {
        let mut items = Vec::new();
        if self.eat(b'}') {
            return Ok(Lit::Dict(items));
        }
        let first = self.value()?;
        if !self.eat(b':') {
            // A set literal: parse the rest so errors inside are still syntax errors.
            if self.eat(b'}') {
                return Ok(Lit::Other("set"));
            }
            if !self.eat(b',') {
                return Err(format!("expected ':' at byte {}", self.i));
            }
            self.items(b'}')?;
            return Ok(Lit::Other("set"));
        }
        items.push((first, self.value()?));
        loop {
            if self.eat(b'}') {
                return Ok(Lit::Dict(items));
            }
            if !self.eat(b',') {
                return Err(format!("expected ',' at byte {}", self.i));
            }
            if self.eat(b'}') {
                return Ok(Lit::Dict(items));
            }
            let k = self.value()?;
            if !self.eat(b':') {
                return Err(format!("expected ':' at byte {}", self.i));
            }
            items.push((k, self.value()?));
        }
    }

    /// One or more adjacent string literals, joined.
    fn strings(&mut self) -> Result<Lit, String> {
        let mut out = String::new();
        loop {
            self.skip();
            let raw = match self.peek() {
                Some(b'r' | b'R') => {
                    self.i += 1;
                    true
                }
                Some(b'u' | b'U') => {
                    self.i += 1;
                    false
                }
                _ => false,
            };
            let Some(q @ (b'\'' | b'"')) = self.peek() else {
                if out.is_empty() && raw {
                    return Err("a string prefix without a string".into());
                }
                return Ok(Lit::Str(out));
            };
            if self.s.get(self.i + 1) == Some(&q) && self.s.get(self.i + 2) == Some(&q) {
                return Err("triple-quoted strings are not read".into());
            }
            self.i += 1;
            loop {
                let Some(c) = self.peek() else {
                    return Err("unterminated string".into());
                };
                self.i += 1;
                match c {
                    _ if c == q => break,
                    b'\n' => return Err("newline in a string".into()),
                    b'\\' if raw => {
                        let Some(n) = self.peek() else {
                            return Err("unterminated string".into());
                        };
                        out.push('\\');
                        out.push(n as char);
                        self.i += 1;
                    }
                    b'\\' => {
                        let Some(n) = self.peek() else {
                            return Err("unterminated string".into());
                        };
                        self.i += 1;
                        match n {
                            b'\n' => {}
                            b'\\' | b'\'' | b'"' => out.push(n as char),
                            b'n' => out.push('\n'),
                            b't' => out.push('\t'),
                            b'r' => out.push('\r'),
                            b'a' => out.push('\x07'),
                            b'b' => out.push('\x08'),
                            b'f' => out.push('\x0c'),
                            b'v' => out.push('\x0b'),
                            b'0'..=b'7' => {
                                // Up to three octal digits.
                                let mut v = u32::from(n - b'0');
                                for _ in 0..2 {
                                    match self.peek() {
                                        Some(d @ b'0'..=b'7') => {
                                            v = v * 8 + u32::from(d - b'0');
                                            self.i += 1;
                                        }
                                        _ => break,
                                    }
                                }
                                out.push(char::from_u32(v).ok_or("bad octal escape")?);
                            }
                            b'x' | b'u' | b'U' => {
                                let digits = match n {
                                    b'x' => 2,
                                    b'u' => 4,
                                    _ => 8,
                                };
                                let hex = self
                                    .s
                                    .get(self.i..self.i + digits)
                                    .and_then(|h| std::str::from_utf8(h).ok())
                                    .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                                    .ok_or("truncated \\x, \\u or \\U escape")?;
                                let v = u32::from_str_radix(hex, 16).map_err(|e| e.to_string())?;
                                out.push(char::from_u32(v).ok_or("escape outside Unicode")?);
                                self.i += digits;
                            }
                            b'N' => {
                                let rest = &self.s[self.i..];
                                let close = rest
                                    .iter()
                                    .position(|&b| b == b'}')
                                    .filter(|_| rest.first() == Some(&b'{'))
                                    .ok_or("malformed \\N{...} escape")?;
                                let name = std::str::from_utf8(&rest[1..close])
                                    .map_err(|e| e.to_string())?;
                                out.push(ascii_named(name).ok_or_else(|| {
                                    format!("\\N{{{name}}} names no printable ASCII character")
                                })?);
                                self.i += close + 1;
                            }
                            // Unknown escapes keep their backslash, as Python does.
                            _ => {
                                out.push('\\');
                                out.push(n as char);
                            }
                        }
                    }
                    _ if c.is_ascii() => out.push(c as char),
                    _ => {
                        // The text is UTF-8 (a version 3 header, or latin-1 bytes decoded):
                        // the whole character.
                        let ch = std::str::from_utf8(&self.s[self.i - 1..])
                            .ok()
                            .and_then(|t| t.chars().next())
                            .ok_or("bad UTF-8 in a string")?;
                        out.push(ch);
                        self.i += ch.len_utf8() - 1;
                    }
                }
            }
        }
    }

    fn int(&mut self) -> Result<Lit, String> {
        let start = self.i;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.')
        {
            self.i += 1;
        }
        let mut tok = std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?;
        if self.long_suffix {
            tok = tok.strip_suffix('L').unwrap_or(tok);
        }
        let bad = || format!("not a number literal: {tok:?}");
        let lower = tok.to_ascii_lowercase();
        if !lower.starts_with("0x")
            && (tok.contains('.') || lower.contains('e') || lower.ends_with('j'))
        {
            // A float or imaginary literal: valid in a header dict, never a valid extent.
            let body = lower.trim_end_matches('j').replace('_', "");
            return match body.parse::<f64>() {
                Ok(_) if !tok.contains("__") => Ok(Lit::Other("float")),
                _ => Err(bad()),
            };
        }
        if tok.starts_with('_') || tok.ends_with('_') || tok.contains("__") {
            return Err(bad());
        }
        let (radix, digits) = match tok.get(..2).map(str::to_ascii_lowercase).as_deref() {
            Some("0x") => (16, &tok[2..]),
            Some("0o") => (8, &tok[2..]),
            Some("0b") => (2, &tok[2..]),
            _ => {
                // Python 3 refuses leading zeros ("007"); "0", "00" are fine.
                if tok.len() > 1
                    && tok.starts_with('0')
                    && tok.bytes().any(|c| c != b'0' && c != b'_')
                {
                    return Err(bad());
                }
                (10, tok)
            }
        };
        let digits = digits.strip_prefix('_').unwrap_or(digits);
        if digits.is_empty() || digits.starts_with('_') {
            return Err(bad());
        }
        let clean: String = digits.chars().filter(|&c| c != '_').collect();
        // Too large for i128 is far past any extent: saturate, and the shape check refuses.
        match i128::from_str_radix(&clean, radix) {
            Ok(n) => Ok(Lit::Int(n)),
            Err(_) if clean.chars().all(|c| c.is_digit(radix)) => Ok(Lit::Int(i128::MAX)),
            Err(_) => Err(bad()),
        }
    }
}

/// The printable ASCII characters by their Unicode names (`\N{DIGIT FOUR}`), in code
/// order from U+0020: a `.npy` header's strings never need more.
const ASCII_NAMES: [&str; 95] = [
    "SPACE",
    "EXCLAMATION MARK",
    "QUOTATION MARK",
    "NUMBER SIGN",
    "DOLLAR SIGN",
    "PERCENT SIGN",
    "AMPERSAND",
    "APOSTROPHE",
    "LEFT PARENTHESIS",
    "RIGHT PARENTHESIS",
    "ASTERISK",
    "PLUS SIGN",
    "COMMA",
    "HYPHEN-MINUS",
    "FULL STOP",
    "SOLIDUS",
    "DIGIT ZERO",
    "DIGIT ONE",
    "DIGIT TWO",
    "DIGIT THREE",
    "DIGIT FOUR",
    "DIGIT FIVE",
    "DIGIT SIX",
    "DIGIT SEVEN",
    "DIGIT EIGHT",
    "DIGIT NINE",
    "COLON",
    "SEMICOLON",
    "LESS-THAN SIGN",
    "EQUALS SIGN",
    "GREATER-THAN SIGN",
    "QUESTION MARK",
    "COMMERCIAL AT",
    "LATIN CAPITAL LETTER A",
    "LATIN CAPITAL LETTER B",
    "LATIN CAPITAL LETTER C",
    "LATIN CAPITAL LETTER D",
    "LATIN CAPITAL LETTER E",
    "LATIN CAPITAL LETTER F",
    "LATIN CAPITAL LETTER G",
    "LATIN CAPITAL LETTER H",
    "LATIN CAPITAL LETTER I",
    "LATIN CAPITAL LETTER J",
    "LATIN CAPITAL LETTER K",
    "LATIN CAPITAL LETTER L",
    "LATIN CAPITAL LETTER M",
    "LATIN CAPITAL LETTER N",
    "LATIN CAPITAL LETTER O",
    "LATIN CAPITAL LETTER P",
    "LATIN CAPITAL LETTER Q",
    "LATIN CAPITAL LETTER R",
    "LATIN CAPITAL LETTER S",
    "LATIN CAPITAL LETTER T",
    "LATIN CAPITAL LETTER U",
    "LATIN CAPITAL LETTER V",
    "LATIN CAPITAL LETTER W",
    "LATIN CAPITAL LETTER X",
    "LATIN CAPITAL LETTER Y",
    "LATIN CAPITAL LETTER Z",
    "LEFT SQUARE BRACKET",
    "REVERSE SOLIDUS",
    "RIGHT SQUARE BRACKET",
    "CIRCUMFLEX ACCENT",
    "LOW LINE",
    "GRAVE ACCENT",
    "LATIN SMALL LETTER A",
    "LATIN SMALL LETTER B",
    "LATIN SMALL LETTER C",
    "LATIN SMALL LETTER D",
    "LATIN SMALL LETTER E",
    "LATIN SMALL LETTER F",
    "LATIN SMALL LETTER G",
    "LATIN SMALL LETTER H",
    "LATIN SMALL LETTER I",
    "LATIN SMALL LETTER J",
    "LATIN SMALL LETTER K",
    "LATIN SMALL LETTER L",
    "LATIN SMALL LETTER M",
    "LATIN SMALL LETTER N",
    "LATIN SMALL LETTER O",
    "LATIN SMALL LETTER P",
    "LATIN SMALL LETTER Q",
    "LATIN SMALL LETTER R",
    "LATIN SMALL LETTER S",
    "LATIN SMALL LETTER T",
    "LATIN SMALL LETTER U",
    "LATIN SMALL LETTER V",
    "LATIN SMALL LETTER W",
    "LATIN SMALL LETTER X",
    "LATIN SMALL LETTER Y",
    "LATIN SMALL LETTER Z",
    "LEFT CURLY BRACKET",
    "VERTICAL LINE",
    "RIGHT CURLY BRACKET",
    "TILDE",
];

/// The printable ASCII character `\N{name}` names (names compare case-insensitively, as
/// Python's do).
fn ascii_named(name: &str) -> Option<char> {
    ASCII_NAMES
        .iter()
        .position(|n| n.eq_ignore_ascii_case(name))
        .map(|i| char::from(0x20 + i as u8))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_(s: &str) -> Result<Lit, String> {
        parse(s, false)
    }

    #[test]
    fn literals_parse_as_python_does() {
        let d = parse_("{'a': (1, 2,), \"b\": (6), 'c': (6,), 'a': 'x' 'y', 'e': -0x1_0}").unwrap();
        assert_eq!(
            d.get("a"),
            Some(&Lit::Str("xy".into())),
            "last duplicate wins"
        );
        assert_eq!(d.get("b"), Some(&Lit::Int(6)));
        assert_eq!(d.get("c"), Some(&Lit::Tuple(vec![Lit::Int(6)])));
        assert_eq!(d.get("e"), Some(&Lit::Int(-16)));
        assert_eq!(d.str_keys().unwrap(), ["a", "b", "c", "e"]);
        assert_eq!(parse_("()").unwrap(), Lit::Tuple(vec![]));
        assert_eq!(parse_("{1}").unwrap(), Lit::Other("set"));
        assert_eq!(
            parse_("(1.5, .5, 1e3, 2j)").unwrap(),
            Lit::Tuple(vec![Lit::Other("float"); 4])
        );
        for bad in [
            "{'a': 1",
            "{'a' 1}",
            "(1,,)",
            "007",
            "1.5.5",
            "1__0",
            "b'x'",
            "{'a': 1}}",
        ] {
            assert!(parse_(bad).is_err(), "{bad}");
        }
        assert!(
            parse_(&"(".repeat(10_000)).is_err(),
            "deep nesting is an error"
        );
        assert_eq!(parse("(3L, 4L)", true).unwrap(), parse_("(3, 4)").unwrap());
        assert!(parse_("(3L, 4L)").is_err());
    }
}
