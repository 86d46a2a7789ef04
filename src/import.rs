//! `holdfast import FILE`: a catalogue loaded straight into the configured
//! database, from CSV or JSON Lines, in batches of one transaction each.
//!
//! Every row is checked with the API's own rules (`POST /v1/assets`); an
//! id that exists is left as it is, so running the same file again changes
//! nothing and says so. A bad row stops the import with its line and the
//! reason before anything of its batch is written; the batches before it
//! stay, and the message says where they end. The file is read as a
//! stream: memory does not grow with its size.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value};
use tokio::task::JoinHandle;

use crate::domain::Price;
use crate::http::{new_asset, CreateAssetRequest, Validator};
use crate::store::{ImportReport, Importer, NewAsset, Store, StoreResult};

/// How the file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A header `id,name,price_amount,price_currency` then `attr.KEY`
    /// columns (the price columns and every attribute optional).
    Csv,
    /// One JSON object per line, each the body of `POST /v1/assets`.
    Jsonl,
}

impl Format {
    /// The format a file's extension names.
    pub fn of(path: &Path) -> Option<Self> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "csv" => Some(Self::Csv),
            "jsonl" | "ndjson" => Some(Self::Jsonl),
            _ => None,
        }
    }
}

/// What to import, and how.
pub struct Options {
    /// The file; `-` reads standard input.
    pub path: PathBuf,
    pub format: Option<Format>,
    /// Rows per transaction.
    pub batch_size: usize,
    /// Batches written at once (PostgreSQL; SQLite has one writer).
    pub writers: usize,
}

/// What an import did.
pub struct Summary {
    pub rows: u64,
    pub report: ImportReport,
    pub elapsed: Duration,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = &self.report;
        let seconds = self.elapsed.as_secs_f64();
        write!(
            f,
            "{} rows read: {} new, {} already present",
            self.rows, r.created, r.present
        )?;
        if !r.differing.is_empty() {
            write!(
                f,
                ", {} present with other data and left as they are",
                r.differing.len()
            )?;
        }
        write!(
            f,
            "; {seconds:.1} s ({:.0} rows/s)",
            self.rows as f64 / seconds.max(1e-9)
        )?;
        if r.created == 0 && r.differing.is_empty() {
            write!(f, ". Nothing changed: every row was already there.")?;
        }
        if !r.differing.is_empty() {
            let shown: Vec<&str> = r.differing.iter().take(10).map(String::as_str).collect();
            let more = match r.differing.len() > shown.len() {
                true => ", …",
                false => "",
            };
            write!(
                f,
                "\nwith other data (change them with PATCH /v1/assets/{{id}}): {}{more}",
                shown.join(", ")
            )?;
        }
        Ok(())
    }
}

/// One row as read: where it starts, and the asset it asks for.
struct Row {
    line: u64,
    asset: Result<CreateAssetRequest, String>,
}

/// Imports the file into `store`.
pub async fn run(store: &Store, options: &Options) -> Result<Summary, String> {
    let format = match (options.format, Format::of(&options.path)) {
        (Some(format), _) | (None, Some(format)) => format,
        (None, None) => {
            return Err(format!(
                "{}: say --format csv or --format jsonl (the extension does not tell)",
                options.path.display()
            ))
        }
    };
    let (input, size) = open(&options.path)?;
    let read = Arc::new(AtomicU64::new(0));
    let input = Counted {
        inner: input,
        read: read.clone(),
    };
    let rows: Box<dyn Iterator<Item = Result<Row, String>>> = match format {
        Format::Csv => Box::new(csv_rows(input)?),
        Format::Jsonl => Box::new(jsonl_rows(input)),
    };
    let mut writers = Writers::open(store, options.writers).await?;
    let mut progress = Progress::new(size, read);
    let started = Instant::now();
    let mut total = 0u64;
    let mut batch: Vec<NewAsset> = Vec::with_capacity(options.batch_size);
    // The first line of the batch being gathered.
    let mut batch_from = None;
    for row in rows {
        let asset = row.and_then(|row| {
            batch_from.get_or_insert(row.line);
            let line = row.line;
            row.asset
                .and_then(|given| checked(&given))
                .map_err(|why| format!("line {line}: {why}"))
        });
        let asset = match asset {
            Ok(asset) => asset,
            Err(why) => return Err(writers.stop(&why, batch_from).await),
        };
        batch.push(asset);
        total += 1;
        if batch.len() >= options.batch_size {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(options.batch_size));
            writers.send(full, batch_from.take().unwrap_or(1)).await?;
            progress.update(total);
        }
    }
    if !batch.is_empty() {
        writers.send(batch, batch_from.unwrap_or(1)).await?;
    }
    let report = writers.finish().await?;
    progress.finish(total);
    Ok(Summary {
        rows: total,
        report,
        elapsed: started.elapsed(),
    })
}

/// A batch being written, from its first line.
type Writing = (u64, JoinHandle<(Importer, StoreResult<ImportReport>)>);

/// The importers, each writing one batch at a time; batches go to the
/// first free one, so that up to as many are written at once.
struct Writers {
    idle: Vec<Importer>,
    busy: VecDeque<Writing>,
    report: ImportReport,
    /// Batches written.
    written: usize,
}

impl Writers {
    async fn open(store: &Store, count: usize) -> Result<Self, String> {
        let mut idle: Vec<Importer> = Vec::with_capacity(count);
        while idle.len() < count.max(1) {
            let importer = store
                .importer()
                .await
                .map_err(|e| crate::http::error::error_chain(&e))?;
            let alone = !importer.writes_concurrently();
            idle.push(importer);
            if alone {
                break;
            }
        }
        Ok(Self {
            idle,
            busy: VecDeque::new(),
            report: ImportReport::default(),
            written: 0,
        })
    }

    /// Hands `batch` (from line `from`) to a free importer, waiting for
    /// the oldest batch in flight when none is free.
    async fn send(&mut self, batch: Vec<NewAsset>, from: u64) -> Result<(), String> {
        if self.idle.is_empty() {
            self.collect_oldest().await?;
        }
        let Some(mut importer) = self.idle.pop() else {
            return Err("no importer is free".into());
        };
        let task = tokio::spawn(async move {
            let written = importer.write(&batch).await;
            (importer, written)
        });
        self.busy.push_back((from, task));
        Ok(())
    }

    /// Waits for the oldest batch in flight; on its failure, for every
    /// other, and says where the import stands.
    async fn collect_oldest(&mut self) -> Result<(), String> {
        let Some((from, task)) = self.busy.pop_front() else {
            return Ok(());
        };
        let failure = match task.await {
            Ok((importer, Ok(report))) => {
                self.idle.push(importer);
                self.report.add(report);
                self.written += 1;
                return Ok(());
            }
            Ok((_, Err(e))) => crate::http::error::error_chain(&e),
            Err(e) => format!("the writing task failed: {e}"),
        };
        let why = format!("writing the rows from line {from} failed: {failure}");
        Err(self.stop(&why, Some(from)).await)
    }

    /// Every batch in flight written (or failed), then the message of an
    /// import stopped at line `from`: why, what was kept, how to go on.
    async fn stop(&mut self, why: &str, from: Option<u64>) -> String {
        let mut first_unwritten = from;
        while let Some((line, task)) = self.busy.pop_front() {
            match task.await {
                Ok((_, Ok(_))) => self.written += 1,
                _ => first_unwritten = Some(first_unwritten.map_or(line, |f| f.min(line))),
            }
        }
        match (self.written, first_unwritten) {
            (0, _) | (_, None) => format!("{why}\nnothing was written."),
            (_, Some(from)) => format!(
                "{why}\nnothing of the batch from line {from} on was written; the rows before \
                 line {from} are imported. Fix the file and run the import again: rows already \
                 present are skipped."
            ),
        }
    }

    async fn finish(mut self) -> Result<ImportReport, String> {
        while !self.busy.is_empty() {
            self.collect_oldest().await?;
        }
        if let Some(importer) = self.idle.first_mut() {
            importer
                .finish()
                .await
                .map_err(|e| crate::http::error::error_chain(&e))?;
        }
        Ok(self.report)
    }
}

/// The asset a row asks for, checked with the API's rules.
fn checked(given: &CreateAssetRequest) -> Result<NewAsset, String> {
    let mut v = Validator::default();
    let asset = new_asset(given, "", &mut v);
    let errors = v.into_errors();
    match (asset, errors.is_empty()) {
        (Some(asset), true) => Ok(asset),
        _ => Err(errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

fn open(path: &Path) -> Result<(Box<dyn Read>, Option<u64>), String> {
    if path.as_os_str() == "-" {
        return Ok((Box::new(std::io::stdin().lock()), None));
    }
    let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let size = file.metadata().ok().map(|m| m.len());
    Ok((Box::new(file), size))
}

/// A reader that counts the bytes read through it.
struct Counted<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// The columns of a CSV file.
enum Column {
    Id,
    Name,
    Amount,
    Currency,
    Attribute(String),
}

fn csv_rows(input: impl Read) -> Result<impl Iterator<Item = Result<Row, String>>, String> {
    let mut reader = csv::ReaderBuilder::new().from_reader(input);
    let header = reader
        .headers()
        .map_err(|e| format!("line 1: cannot read the header: {e}"))?
        .clone();
    let columns = header
        .iter()
        .map(|name| match name.trim() {
            "id" => Ok(Column::Id),
            "name" => Ok(Column::Name),
            "price_amount" => Ok(Column::Amount),
            "price_currency" => Ok(Column::Currency),
            other => match other.strip_prefix("attr.") {
                Some(key) => Ok(Column::Attribute(key.to_owned())),
                None => Err(format!(
                    "line 1: column {other:?} is not id, name, price_amount, price_currency or \
                     attr.KEY"
                )),
            },
        })
        .collect::<Result<Vec<_>, _>>()?;
    for needed in ["id", "name"] {
        if !header.iter().any(|name| name.trim() == needed) {
            return Err(format!("line 1: the header has no {needed:?} column"));
        }
    }
    Ok(reader.into_records().map(move |record| {
        let record = record.map_err(|e| match e.position() {
            Some(at) => format!("line {}: {e}", at.line()),
            None => e.to_string(),
        })?;
        let line = record.position().map_or(0, csv::Position::line);
        Ok(Row {
            line,
            asset: csv_asset(&columns, &record),
        })
    }))
}

fn csv_asset(columns: &[Column], record: &csv::StringRecord) -> Result<CreateAssetRequest, String> {
    let (mut id, mut name, mut amount, mut currency) = (None, None, None, None);
    let mut attributes = Map::new();
    for (column, cell) in columns.iter().zip(record.iter()) {
        match column {
            Column::Id => id = Some(cell.to_owned()),
            Column::Name => name = Some(cell.to_owned()),
            Column::Amount if !cell.is_empty() => amount = Some(cell),
            Column::Currency if !cell.is_empty() => currency = Some(cell.to_owned()),
            Column::Attribute(key) if !cell.is_empty() => {
                attributes.insert(key.clone(), cell_value(cell));
            }
            _ => {}
        }
    }
    let price = match (amount, currency) {
        (None, None) => None,
        (Some(amount), Some(currency)) => Some(Price {
            amount: amount
                .parse()
                .map_err(|_| format!("price_amount: {amount:?} is not a whole number"))?,
            currency,
        }),
        _ => return Err("price_amount and price_currency: give both, or neither".into()),
    };
    Ok(CreateAssetRequest {
        id: id.unwrap_or_default(),
        name: name.unwrap_or_default(),
        price,
        attributes: Some(Value::Object(attributes)),
        available_from: None,
    })
}

/// An attribute cell's value: `true` and `false` are booleans, a whole
/// number written as such (no sign but `-`, no leading zero) an integer,
/// anything else a string.
fn cell_value(cell: &str) -> Value {
    match cell {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        _ => match cell.parse::<i64>() {
            Ok(n) if n.to_string() == cell => Value::from(n),
            _ => Value::String(cell.to_owned()),
        },
    }
}

fn jsonl_rows(input: impl Read) -> impl Iterator<Item = Result<Row, String>> {
    BufReader::new(input)
        .lines()
        .zip(1u64..)
        .filter(|(text, _)| text.as_ref().map_or(true, |t| !t.trim().is_empty()))
        .map(|(text, line)| {
            let text = text.map_err(|e| format!("line {line}: cannot read: {e}"))?;
            let asset = serde_json::from_str::<CreateAssetRequest>(&text)
                .map_err(|e| format!("not an asset: {e}"));
            Ok(Row { line, asset })
        })
}

/// A bar on a terminal; elsewhere a line every few seconds.
struct Progress {
    bar: Option<ProgressBar>,
    read: Arc<AtomicU64>,
    size: Option<u64>,
    started: Instant,
    last_line: Instant,
}

const PROGRESS_EVERY: Duration = Duration::from_secs(5);

impl Progress {
    fn new(size: Option<u64>, read: Arc<AtomicU64>) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = match size {
                Some(size) => ProgressBar::new(size),
                None => ProgressBar::new_spinner(),
            };
            let template = match size {
                Some(_) => "{bar:30} {percent:>3}% {msg} (ETA {eta})",
                None => "{spinner} {msg}",
            };
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style);
            }
            bar
        });
        Self {
            bar,
            read,
            size,
            started: Instant::now(),
            last_line: Instant::now(),
        }
    }

    fn rate(&self, rows: u64) -> f64 {
        rows as f64 / self.started.elapsed().as_secs_f64().max(1e-9)
    }

    fn update(&mut self, rows: u64) {
        let read = self.read.load(Ordering::Relaxed);
        let rate = self.rate(rows);
        if let Some(bar) = &self.bar {
            bar.set_position(read);
            bar.set_message(format!("{rows} rows, {rate:.0} rows/s"));
        } else if self.last_line.elapsed() >= PROGRESS_EVERY {
            self.last_line = Instant::now();
            let share = match self.size {
                Some(size) if size > 0 => {
                    format!(", {:.0} % of the file", read as f64 * 100.0 / size as f64)
                }
                _ => String::new(),
            };
            eprintln!("import: {rows} rows ({rate:.0} rows/s){share}");
        }
    }

    fn finish(&mut self, rows: u64) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        } else if rows > 0 {
            eprintln!("import: {rows} rows ({:.0} rows/s), done", self.rate(rows));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_read_as_the_attribute_filter_does() {
        assert_eq!(cell_value("4"), Value::from(4));
        assert_eq!(cell_value("-12"), Value::from(-12));
        assert_eq!(cell_value("007"), Value::from("007"));
        assert_eq!(cell_value("+5"), Value::from("+5"));
        assert_eq!(cell_value("true"), Value::Bool(true));
        assert_eq!(cell_value("True"), Value::from("True"));
        assert_eq!(cell_value("AB"), Value::from("AB"));
    }

    #[test]
    fn the_format_comes_from_the_extension() {
        assert_eq!(Format::of(Path::new("plates.CSV")), Some(Format::Csv));
        assert_eq!(Format::of(Path::new("lots.ndjson")), Some(Format::Jsonl));
        assert_eq!(Format::of(Path::new("lots.txt")), None);
    }
}
